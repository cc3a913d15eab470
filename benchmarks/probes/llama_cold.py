"""Cold compile of compile_time.py's 24-layer Llama at tiny widths, on this CPU (issue 29 probe).

    python benchmarks/probes/llama_cold.py --train                 # C++ renderer, one process
    python benchmarks/probes/llama_cold.py --triton --train         # Triton renderer (interpreted run)
    python benchmarks/probes/llama_cold.py --triton --profile 30    # + top functions under cProfile

The same graph as the H100's ``llama_infer``/``llama_train`` rows (24 layers, the same ops; hidden
64 so running is cheap), compiled whole-model with an empty ember cache in this process. Prints the
first call's wall time and cumulative seconds of each compile phase (cProfile-free timers wrapped
around the phase functions; nested phases are part of their parents). ``--triton``: Triton source
rendered as on the GPU (``EMBER_NATIVE_FORCE_TRITON``, kernels run in the interpreter; the
the ATen graph then runs instead of the interpreted kernels, unless ``--run-kernels``).
"""
from __future__ import annotations

import argparse
import collections
import functools
import importlib
import os
import sys
import tempfile
import time

# (label, module, attribute): wall seconds of each phase (cumulative; nested phases count in their parents)
PHASES = (
    ("frontend: _compile (all)", "ember.frontend.convert", "_compile"),
    ("aot: build_variant", "ember.aot.pipeline", "build_variant"),
    ("aot: analysis.collect", "ember.aot.analysis", "collect"),
    ("aot: blocks plan (templates)", "ember.aot.blocks", "plan"),
    ("aot: blocks template trace", "ember.aot.blocks", "_trace_template"),
    ("aot: blocks inline", "ember.aot.blocks", "inline"),
    ("aot: trace_forward_analyzed", "ember.aot.pipeline", "trace_forward_analyzed"),
    ("aot: cache store", "ember.aot.cache", "store"),
    ("aot: trace_forward", "ember.aot.pipeline", "trace_forward"),
    ("aot: trace_joint", "ember.aot.pipeline", "trace_joint"),
    ("aot: trace_joint_analyzed", "ember.aot.pipeline", "trace_joint_analyzed"),
    ("aot: partition", "ember.aot.partition", "partition"),
    ("native: compile_aten_graph", "ember.native.backend", "compile_aten_graph"),
    ("native: graph_key", "ember.native.cache", "graph_key"),
    ("native: passes", "ember.native.passes", "run"),
    ("native: lower", "ember.native.lowering", "lower"),
    ("native: split_reductions", "ember.native.split_reduction", "split_reductions"),
    ("native: schedule", "ember.native.scheduler", "schedule"),
    ("native: emit triton", "ember.native.triton_emit", "emit_kernel"),
    ("native: emit cpp", "ember.native.cpp_emit", "emit_kernel"),
    ("native: wrapper", "ember.native.wrapper", "WrapperCodegen.generate"),
    ("native: load wrapper", "ember.native.cache", "load_module"),
)


def wrap_phases(T, C, N):
    for label, modname, attr in PHASES:
        try:
            mod = importlib.import_module(modname)
        except ImportError:
            continue
        owner, name = mod, attr
        if "." in attr:
            cls, name = attr.split(".")
            owner = getattr(mod, cls, None)
        f = getattr(owner, name, None) if owner is not None else None
        if f is None:
            continue

        def make(f, label):
            @functools.wraps(f)
            def g(*a, **k):
                t, c = time.perf_counter(), time.thread_time()
                try:
                    return f(*a, **k)
                finally:
                    T[label] += time.perf_counter() - t
                    C[label] += time.thread_time() - c
                    N[label] += 1
            return g
        setattr(owner, name, make(f, label))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--train", action="store_true")
    p.add_argument("--triton", action="store_true")
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--profile", type=int, default=0, help="top N functions under cProfile (own and cumulative)")
    p.add_argument("--prof-out", default=None)
    p.add_argument("--profile-only", default=None, help="module:function: cProfile only inside its calls "
                   "(e.g. ember.aot.trace:trace_joint)")
    p.add_argument("--run-kernels", action="store_true", help="--triton: run the interpreted kernels (default: "
                   "each compiled graph is generated and loaded, then its ATen graph runs, so only compile work is timed)")
    a = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="llama_cold_")
    os.environ["EMBER_CACHE_DIR"] = os.path.join(tmp, "ember")
    if a.triton:
        os.environ["TRITON_INTERPRET"] = "1"
        os.environ["EMBER_NATIVE_FORCE_TRITON"] = "1"
    import torch
    torch.set_num_threads(1)
    from transformers import LlamaConfig, LlamaForCausalLM
    import ember
    import ember.aot  # noqa: F401
    import ember.native.backend  # noqa: F401
    import ember.frontend.convert  # noqa: F401
    import ember.aot.pipeline  # noqa: F401
    import triton.language  # noqa: F401  (imports excluded)
    T, C, N = collections.defaultdict(float), collections.defaultdict(float), collections.Counter()
    if a.triton and not a.run_kernels:
        import ember.native.backend as nb
        compile_one = nb._compile

        def generate_only(gm, example_inputs, opts, renderer="triton"):
            call = compile_one(gm, example_inputs, opts, renderer)
            run = gm.forward

            def eager(*args):
                return run(*args)
            eager.ember_native = call.ember_native
            return eager
        nb._compile = generate_only
    if not (a.profile or a.prof_out):  # (timers would show as callers in the profile)
        wrap_phases(T, C, N)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=a.layers, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    dtype = torch.bfloat16 if a.triton else torch.float32
    m = LlamaForCausalLM(cfg).to("cpu", dtype)
    ids = torch.randint(0, 128, (1, 16))
    if a.train:
        opt = torch.optim.AdamW(m.parameters(), lr=1e-5)
        cm = ember.compile(m)

        def step():
            loss = cm(ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.detach()
    else:
        m.eval()
        cm = ember.compile(m)

        def step():
            with torch.no_grad():
                return cm(ids).logits
    prof = None
    if a.profile or a.prof_out:
        import cProfile
        prof = cProfile.Profile()
    if prof is not None and a.profile_only:
        modname, attr = a.profile_only.split(":")
        mod = importlib.import_module(modname)
        inner, only = getattr(mod, attr), prof

        @functools.wraps(inner)
        def profiled(*args, **kwargs):
            only.enable()
            try:
                return inner(*args, **kwargs)
            finally:
                only.disable()
        setattr(mod, attr, profiled)
        prof = None  # (not around the whole call)
    import gc
    gc_s, gc_n, gc_t = collections.Counter(), collections.Counter(), [0.0]

    def gc_timer(phase, info):  # Python's cyclic collections during the first call, by generation
        if phase == "start":
            gc_t[0] = time.perf_counter()
        else:
            gc_s[info["generation"]] += time.perf_counter() - gc_t[0]
            gc_n[info["generation"]] += 1
    gc.callbacks.append(gc_timer)
    t0, c0 = time.perf_counter(), time.thread_time()
    if prof:
        prof.enable()
    step()
    if prof:
        prof.disable()
    first, cpu = time.perf_counter() - t0, time.thread_time() - c0
    gc.callbacks.remove(gc_timer)
    t1 = time.perf_counter()
    step()
    again = time.perf_counter() - t1
    from ember.native.backend import COUNTERS
    try:
        from ember.aot.trace import JOINT_ANALYZED  # (absent before session 39: the probe runs on older trees too)
        from ember.aot.trace import FORWARD_UNFUNCTIONALIZED
    except ImportError:
        JOINT_ANALYZED = FORWARD_UNFUNCTIONALIZED = {}
    print(f"llama {'train' if a.train else 'infer'} {a.layers} layers {'triton' if a.triton else 'cpp'}: first call "
          f"{first:.3f} s wall {cpu:.3f} s cpu (main thread); second call {again:.3f} s; {COUNTERS}; "
          f"joint analyzed in the trace {dict(JOINT_ANALYZED)}, forward unfunctionalized {dict(FORWARD_UNFUNCTIONALIZED)}")
    print("  gc during the first call: " + ", ".join(f"gen{g} x{gc_n[g]} {gc_s[g]:.3f} s" for g in sorted(gc_n)))
    for label, _, _ in PHASES:
        if label in T:
            print(f"  {label:<34} {T[label]:8.3f} s wall {C[label]:8.3f} s cpu  x{N[label]}")
    prof = prof or (only if a.profile_only else None)
    if prof:
        if a.prof_out:
            prof.dump_stats(a.prof_out)
        import pstats
        st = pstats.Stats(prof, stream=sys.stdout)
        st.sort_stats("tottime").print_stats(a.profile or 30)
        st.sort_stats("cumulative").print_stats(a.profile or 30)


if __name__ == "__main__":
    main()
