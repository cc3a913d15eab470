"""Compile every kernel the op table generates for a real GPU target (sm_90) without a GPU:
``triton.compile`` runs the whole toolchain (TTIR, TTGIR, LLVM, PTX, ptxas) offline. This catches
what the interpreter accepts but the compiler rejects (types of loop-carried values, libdevice calls).

Run as a script in a process WITHOUT ``TRITON_INTERPRET`` (test_gpu_compile.py does that):
``python tests/native/gpu_compile_check.py [case,case,...] [--symbolic]``; prints a JSON summary as its
last line. ``--symbolic`` traces with symbolic sizes (dynamic shapes): kernels then take their sizes
as run-time arguments, and loop over a run-time rnumel, which the interpreter never sees.
"""
import importlib.util
import json
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

SIG = {torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.float64: "*fp64",
       torch.int64: "*i64", torch.int32: "*i32", torch.int16: "*i16", torch.int8: "*i8", torch.uint8: "*u8",
       torch.bool: "*i1"}


def compile_kernel(name, ek, layouts, target, tmpdir):
    import triton
    from ember.native.backend import kernel_module
    path = os.path.join(tmpdir, f"{name}.py")
    with open(path, "w") as f:
        f.write(kernel_module(name, ek))
    spec = importlib.util.spec_from_file_location(f"gpu_check_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    fn = getattr(mod, name)
    sig, consts = {}, {}
    values = {"xnumel": ek.xnumel, "rnumel": ek.rnumel, "XBLOCK": ek.config.XBLOCK, "RBLOCK": ek.config.RBLOCK}
    ptrs = iter(ek.args)
    for i, arg in enumerate(fn.arg_names):
        if "ptr" in arg:
            sig[arg] = SIG[layouts[next(ptrs)].dtype]
        elif i in fn.constexprs:
            sig[arg] = "constexpr"
            consts[(i,)] = values[arg]
        else:
            sig[arg] = "i32"
    src = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=consts)
    triton.compile(src, target=target, options={"num_warps": ek.config.num_warps})


def main(pattern="", symbolic=False):
    assert os.environ.get("TRITON_INTERPRET", "0") != "1", "run without the interpreter"
    import tempfile

    from triton.backends.compiler import GPUTarget

    from ember.native.backend import DEFAULT_OPTIONS, plan
    from ember.native.lowering import Unsupported
    from ember.native.symbolic import SymbolicUnsupported
    from tests.native.harness import trace
    from tests.native.optable import OPS, f32
    from tests.native.test_ops import SMALL_BLOCKS

    target = GPUTarget("cuda", 90, 32)
    variants = [(c, dt, {}) for c in OPS for dt in c.dtypes] + [(c, f32, SMALL_BLOCKS) for c in OPS if c.looped]
    failures, seen, t0 = [], set(), time.perf_counter()
    with tempfile.TemporaryDirectory() as tmpdir:
        for case, dt, opts in variants:
            if pattern and not any(p == case.name for p in pattern.split(",")):
                continue
            torch.manual_seed(0)
            inputs = case.make(dt, "cpu")
            try:
                gm = trace(case.fn, inputs, "symbolic" if symbolic else "fake")
                g, _, _, emitted = plan(gm, inputs, dict(DEFAULT_OPTIONS, **opts))
                layouts = g.buffers()
                for i, (_, ek) in enumerate(emitted):
                    key = (ek.source, tuple(SIG[layouts[a].dtype] for a in ek.args), ek.config.XBLOCK,
                           ek.config.RBLOCK, ek.rnumel)
                    if key in seen:
                        continue
                    seen.add(key)
                    compile_kernel(f"k{len(seen)}", ek, layouts, target, tmpdir)
            except Exception as e:  # report every failure, keep going
                if symbolic and isinstance(e, (SymbolicUnsupported, Unsupported)):
                    continue  # such graphs compile per size, as static graphs (checked without --symbolic)
                failures.append(f"{case.name}-{dt}-{bool(opts)}: {type(e).__name__}: {str(e)[:400]}")
    print(json.dumps({"kernels": len(seen), "failures": failures, "seconds": round(time.perf_counter() - t0, 1)}))


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--symbolic"]
    main(args[0] if args else "", symbolic="--symbolic" in sys.argv)
