"""One process of tests/native/test_extern_check.py's warm-start test: compile a graph calling a lying
custom op and one calling an honest one (cache dir argv[2], renderer argv[1]: cpp or triton), call
each three times, print ``RESULT {json}``: cache hit, right results, mismatches and passes counted."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402

from ember.native import compile_aten_graph, extern_check  # noqa: E402
from tests.native.harness import trace  # noqa: E402
from tests.native.lying_ops import OPS  # noqa: E402


def main(renderer, cache_dir):
    dev = "cuda" if renderer == "triton" and torch.cuda.is_available() else "cpu"
    x = torch.randn(4, 6, device=dev)
    right, hits = True, []
    for fn in (lambda x: (OPS.dtype(x).sin() + 1,), lambda x: (OPS.honest(x).sin() + 1,)):
        gm = trace(fn, [x])
        compiled = compile_aten_graph(gm, [x], force_triton=renderer == "triton",
                                      options={"cache_dir": cache_dir, "cpu_codegen": "cpp"})
        assert compiled.ember_native["reason"] is None, compiled.ember_native["reason"]
        hits.append(compiled.ember_native["cache_hit"])
        ref = fn(x)
        for _ in range(3):
            out = compiled(x)
            right &= all(a.dtype == b.dtype and a.shape == b.shape and torch.allclose(a, b, atol=1e-5) for a, b in zip(out, ref))
    print("RESULT " + json.dumps({"hit": all(hits), "right": bool(right), "mismatches": extern_check.STATS["mismatches"],
                                  "honest_passed": extern_check.STATS["passed"]}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
