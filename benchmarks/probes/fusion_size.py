"""Sizes of the fused Triton kernels ember generates for a benchmark row, on this CPU (issue 29 probe).

    python benchmarks/probes/fusion_size.py llama_train              # the H100 row's graphs, full widths
    EMBER_NATIVE_MAX_FUSED_BUFFERS=0 \\
        python benchmarks/probes/fusion_size.py llama_train          # without the fusion cap
    python benchmarks/probes/fusion_size.py gpt2_train --top 5 --json out.json

Rows: ``llama_infer``/``llama_train`` (compile_time.py's ~1.2B Llama; ``--layers`` another depth) and
gpu_suite.py's rows, at their GPU shapes, built on the CPU. Triton source is generated as for a GPU
(``EMBER_NATIVE_FORCE_TRITON``, the interpreter's settings): every graph is lowered, scheduled and
emitted, then answers with zero tensors of its outputs' shapes instead of running, so a 1B model's
step costs only its compile. Prints per graph the kernels (launches per call), the distinct kernel
sources (the builds a cold start runs) and the largest kernels: buffers (pointer arguments),
reductions, tl.load count, source length, launch config. What makes ptxas slow on the GPU is what
these count: many live values (loads, accumulator tiles) in one kernel.

Caveats: training rows run under CPU autocast here (CUDA autocast lists a few ops differently), and
launch configs come from the interpreter's heuristics (the same code as on a GPU apart from device
limits), so counts match the H100's closely, not exactly.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("row")
    p.add_argument("--layers", type=int, default=24, help="llama rows: decoder layers")
    p.add_argument("--top", type=int, default=6, help="largest kernels listed per graph")
    p.add_argument("--json", default=None, help="write the per-kernel table here")
    p.add_argument("--s39-fusion", action="store_true", help="session 39's kernels: no fusion cap, libdevice "
                   "values inlined in every reader (lowering.GraphLowering.REALIZE_LIBDEVICE_NUMEL=0)")
    p.add_argument("--keep", default=None, help="generate into this ember cache directory (kept: "
                   "cpu_kernel_builds.py builds its kernels); default a fresh temporary one")
    a = p.parse_args()
    os.environ["EMBER_CACHE_DIR"] = a.keep or tempfile.mkdtemp(prefix="fusion_size_")
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ["EMBER_NATIVE_FORCE_TRITON"] = "1"
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.dirname(here))  # benchmarks/
    import torch
    torch.set_num_threads(max(1, (os.cpu_count() or 1)))
    import ember
    import ember.native.backend as nb
    from ember.native import lowering
    if a.s39_fusion:
        ember.config.native_max_fused_buffers = 0
        lowering.GraphLowering.REALIZE_LIBDEVICE_NUMEL = 0
    from ember.native import triton_emit

    graphs = []  # one list of kernel records per compiled graph
    emit = triton_emit.emit_kernel

    def recording_emit(k, layouts, options, sv=None):
        e = emit(k, layouts, options, sv)
        graphs[-1].append(dict(kind=e.kind, buffers=len(e.args), nodes=len(k.nodes),
                               reductions=sum(1 for r in k.roles.values() if r in ("red", "xred")),
                               loads=e.source.count("tl.load("), stores=e.source.count("tl.store("),
                               chars=len(e.source), config=f"X{e.config.XBLOCK} R{e.config.RBLOCK} w{e.config.num_warps}"
                               f"{' s' + str(e.config.num_stages) if e.config.num_stages else ''}", ops=e.comment.splitlines()[0][:100] if e.comment else "",
                               source=e.source))
        return e
    triton_emit.emit_kernel = recording_emit
    from ember.native import scheduler
    sched_s = [0.0]
    schedule = scheduler.schedule

    def timed_schedule(g, options=None):
        t = time.perf_counter()
        try:
            return schedule(g, options)
        finally:
            sched_s[0] += time.perf_counter() - t
    scheduler.schedule = timed_schedule
    compile_one = nb._compile

    def generate_only(gm, example_inputs, opts, renderer="triton"):
        graphs.append([])
        call = compile_one(gm, example_inputs, opts, renderer)
        outs = [n for n in gm.graph.nodes if n.op == "output"][0].args[0]

        def zeros(v):
            val = v.meta.get("val") if isinstance(v, torch.fx.Node) else v
            if isinstance(val, torch.Tensor):
                return torch.empty_strided(val.shape, val.stride(), dtype=val.dtype).zero_()
            return val

        def answer(*args):
            r = [zeros(o) for o in outs] if isinstance(outs, (list, tuple)) else zeros(outs)
            if isinstance(args[0] if len(args) == 1 else None, list):
                args[0].clear()  # (a boxed backward graph empties its argument list)
            return r
        answer.ember_native = call.ember_native
        return answer
    nb._compile = generate_only

    t0 = time.perf_counter()
    if a.row.startswith("llama"):
        import compile_time as ct
        torch.set_default_dtype(torch.bfloat16)  # (initialized in bf16: 1.2B parameters in fp32 take long)
        build, inputs = ct.llama("cpu", False, a.row == "llama_train", layers=a.layers)
        torch.set_default_dtype(torch.float32)
    else:
        from gpu_suite import make
        build, inputs, _ = make(a.row, "cpu", False)
    made = time.perf_counter() - t0
    step = build(lambda f: ember.compile(f))
    t0 = time.perf_counter()
    step(*inputs)
    first = time.perf_counter() - t0
    caps = {"max_fused_buffers": ember.config.native_max_fused_buffers,
            "realize_libdevice_numel": lowering.GraphLowering.REALIZE_LIBDEVICE_NUMEL}
    print(f"{a.row}: model {made:.1f} s, first call (compile, no run) {first:.1f} s, of which scheduling {sched_s[0]:.2f} s; caps {caps}")
    total_launch, total_src = 0, set()
    for gi, ks in enumerate(graphs):
        srcs = {k["source"] for k in ks}
        total_launch += len(ks)
        total_src |= srcs
        big = sorted(ks, key=lambda k: -k["chars"])
        uniq, seen = [], set()
        for k in big:
            if k["source"] not in seen:
                seen.add(k["source"])
                uniq.append(k)
        print(f"  graph {gi}: {len(ks)} kernel launches per call, {len(srcs)} distinct kernels; "
              f"most buffers {max((k['buffers'] for k in ks), default=0)}, most reductions "
              f"{max((k['reductions'] for k in ks), default=0)}")
        for k in uniq[:a.top]:
            print(f"    {k['kind']} buffers {k['buffers']:3d} reductions {k['reductions']:2d} loads {k['loads']:3d} "
                  f"stores {k['stores']:2d} chars {k['chars']:6d} nodes {k['nodes']:2d} {k['config']}")
    print(f"  total: {total_launch} kernel launches per call, {len(total_src)} distinct kernel sources")
    if a.json:
        json.dump(dict(row=a.row, caps=caps, graphs=[[{k: v for k, v in r.items() if k != "source"} for r in ks]
                                                      for ks in graphs]), open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
