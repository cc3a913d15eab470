"""Compile, for sm_90 and without a GPU, every kernel of the symbolic forward and backward graphs of
the GPT-2-like model of test_native_dynamic.py (``triton.compile`` runs the whole toolchain). The
interpreter runs loops over a run-time rnumel with a constexpr bound, so only this checks the GPU
form of those kernels on a model. Run WITHOUT ``TRITON_INTERPRET``; prints a JSON summary last.
"""
import json
import os
import sys
import tempfile
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)


def main():
    assert os.environ.get("TRITON_INTERPRET", "0") != "1", "run without the interpreter"
    import torch
    import torch.nn.functional as F
    from triton.backends.compiler import GPUTarget

    import ember
    import ember.native
    from ember.config import config
    from ember.native.backend import DEFAULT_OPTIONS, plan
    from tests.dynamic.test_native_dynamic import GPT
    from tests.native.gpu_compile_check import compile_kernel

    warnings.simplefilter("ignore")
    graphs = []

    def capture(gm, example_inputs, **kw):  # the graphs the native backend would compile
        graphs.append((gm, list(example_inputs)))
        return gm.forward
    ember.native.compile_aten_graph = capture
    with tempfile.TemporaryDirectory() as tmp:
        config.cache_dir = tmp
        torch.manual_seed(0)
        compiled = ember.compile(GPT())
        for s in (3, 4):  # static, then symbolic sequence length
            idx, y = torch.randint(0, 50, (2, s)), torch.randint(0, 50, (2, s))
            F.cross_entropy(compiled(idx).flatten(0, 1), y.flatten()).backward()
        symbolic = graphs[2:]  # the first forward and backward graphs are static
        n = 0
        for gm, ex in symbolic:
            g, _, _, emitted = plan(gm, ex, dict(DEFAULT_OPTIONS))
            assert g.sizevars.symbolic
            for _, ek in emitted:
                compile_kernel(f"k{n}", ek, g.buffers(), GPUTarget("cuda", 90, 32), tmp)
                n += 1
    print(json.dumps({"graphs": len(symbolic), "kernels": n}))


if __name__ == "__main__":
    main()
