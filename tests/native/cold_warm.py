"""Compile one graph in a fresh process and print the compile time and cache hit as JSON (run twice
by test_backend.py with the same cache dir: the second process must skip code generation)."""
import json
import os
import sys
import time

if __name__ == "__main__":
    t0 = time.perf_counter()
    if os.environ.get("EMBER_TEST_DEVICE", "cpu") == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton
    import torch
    import torch.nn.functional as F
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from tests.native.harness import DEVICE, trace
    from ember.native import compile_aten_graph
    t_import = time.perf_counter() - t0

    def block(x, w, b, g):
        h = F.gelu(x @ w + b)
        return F.layer_norm(h, (h.shape[-1],), g) + torch.softmax(h, -1)
    torch.manual_seed(0)
    args = [torch.randn(8, 16, device=DEVICE), torch.randn(16, 24, device=DEVICE), torch.randn(24, device=DEVICE),
            torch.randn(24, device=DEVICE)]
    t1 = time.perf_counter()
    gm = trace(block, args)
    t_trace = time.perf_counter() - t1
    fn = compile_aten_graph(gm, args, force_triton=True, options={"cache_dir": sys.argv[1]})
    t2 = time.perf_counter()
    out = fn(*args)
    t_first_call = time.perf_counter() - t2
    torch.testing.assert_close(out, block(*args), atol=1e-4, rtol=1e-4)
    info = fn.ember_native
    print(json.dumps({"cache_hit": info["cache_hit"], "compile_s": info["compile_s"], "import_s": t_import,
                      "trace_s": t_trace, "first_call_s": t_first_call, "kernels": info["report"]["kernels"]}))
