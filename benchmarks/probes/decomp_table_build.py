"""CPU seconds to build ember's decomposition tables in a fresh process (the first trace of a cold
compile pays this), one table per process:

    python benchmarks/probes/decomp_table_build.py core|aot|native|native_aot [reps]

``core``: ``ember.aot.ops.core_aten_table()``; ``aot``: ``decomposition_table(None)`` (the CPU autograd
path's table) fully read; ``native_aot``: ``decomposition_table(AOT_DECOMPOSITIONS)`` (the native
backend's, CUDA and C++) fully read; ``lookup``: that table asked for the ~30 ops a softmax/MLP/LN+GELU
trace asks about, then copied as make_fx copies it. Prints the seconds (wall, thread CPU) per process.
"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import torch  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402,F401  (imported by any trace)

import ember  # noqa: E402,F401
from ember.aot import ops  # noqa: E402
from ember.native import decomp  # noqa: E402

aten = torch.ops.aten
LOOKED_UP = [aten._softmax.default, aten.amax.default, aten.sub.Tensor, aten.exp.default, aten.sum.dim_IntList,
             aten.div.Tensor, aten.native_layer_norm.default, aten.gelu.default, aten.addmm.default,
             aten.t.default, aten.relu.default, aten.mm.default, aten.view.default, aten.detach.default,
             aten.linear.default, aten.layer_norm.default, aten.softmax.int, aten.transpose.int,
             aten.permute.default, aten.expand.default, aten.mul.Tensor, aten.add.Tensor, aten.rsqrt.default,
             aten.var_mean.correction, aten.erf.default, aten.clone.default, aten._to_copy.default]


def which(kind: str):
    if kind == "core":
        return lambda: ops.core_aten_table()
    if kind == "aot":
        return lambda: dict(ops.decomposition_table(None))
    if kind == "native_aot":
        return lambda: dict(ops.decomposition_table(decomp.AOT_DECOMPOSITIONS))
    if kind == "lookup":
        def lookup():
            t = ops.decomposition_table(decomp.AOT_DECOMPOSITIONS)
            for op in LOOKED_UP:
                if op in t:
                    t[op]
            return t
        return lookup
    raise SystemExit(f"unknown table {kind}")


if __name__ == "__main__":
    fn = which(sys.argv[1])
    w, c = time.perf_counter(), time.thread_time()
    fn()
    print(f"{sys.argv[1]} wall {time.perf_counter() - w:.3f} s cpu {time.thread_time() - c:.3f} s", flush=True)
