"""Probe: what a process decided for each compiled graph, as one JSON line, so a compiling (cold)
process and a process starting from its caches (warm) can be compared decision by decision.

    EMBER_CACHE_DIR=/tmp/c TRITON_CACHE_DIR=/tmp/t python benchmarks/probes/warm_decisions.py WL [--device cpu]
    # run it twice with the same directories: the second line must equal the first but for "hits"

Per native graph (in compile order): the wrapper's SHA-256 (the generated code: kernels, configs,
extern choices, buffer reuse), and after the warm-up calls, per launch site: grid, meta (block sizes,
num_warps, num_stages), whether the per-call fast path is set and whether it calls Triton's C launcher
directly (``runtime.Launch``). Also the aot layer's graphs (their code hashes) and cache counters.
WL: tiny_block, tiny_block_train, tiny_bert, tiny_gpt2, tiny_gpt2_train (CPU: Triton under the interpreter, forced), or any
gpu_suite workload on cuda.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def _tiny(wl: str, dev: str):
    import torch
    torch.manual_seed(0)
    if wl.startswith("tiny_block"):  # a transformer MLP block: matmuls, GELU, layer norm, softmax
        class Block(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc1, self.fc2, self.ln = torch.nn.Linear(32, 64), torch.nn.Linear(64, 32), torch.nn.LayerNorm(32)

            def forward(self, x):
                h = self.fc2(torch.nn.functional.gelu(self.fc1(x)))
                return torch.softmax(self.ln(h + x), -1)
        m = Block().to(dev)
        x = torch.randn(8, 32, device=dev)
        if wl == "tiny_block":
            return (lambda cm: cm), m.eval(), (x,), False
        return (lambda cm: (lambda x: cm(x).pow(2).sum())), m, (x,), True
    if wl == "tiny_bert":
        from transformers import BertConfig, BertModel
        cfg = BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                         vocab_size=128, max_position_embeddings=64)
        cfg._attn_implementation = "sdpa"
        m = BertModel(cfg).to(dev).eval()
        ids = torch.randint(0, 128, (2, 16), device=dev)
        return (lambda cm: (lambda x: cm(x).last_hidden_state)), m, (ids,), False
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64)
    cfg._attn_implementation = "sdpa"
    m = GPT2LMHeadModel(cfg).to(dev)
    ids = torch.randint(0, 128, (2, 16), device=dev)
    if wl == "tiny_gpt2":
        return (lambda cm: (lambda x: cm(x).logits)), m.eval(), (ids,), False
    return (lambda cm: (lambda x: cm(x, labels=x).loss)), m, (ids,), True


def _launch_state(site) -> dict:
    fast = site.fast
    rec = dict(grid=list(site.grid), meta={k: v for k, v in sorted(site.meta.items())}, fast=fast is not None,
               direct=bool(site.direct))
    if fast is not None:
        rec["launcher"] = getattr(fast[0], "__qualname__", None) or type(fast[0]).__name__
        rec["checks"] = [list(c) for c in fast[8]]
    return rec


def decisions(wl: str, dev: str, calls: int = 3, time_it: bool = False) -> dict:
    import torch
    import ember
    from ember.aot import cache as aot_cache
    from ember.native import backend, cache

    compiled = []
    real = backend._compile

    def spy(gm, example_inputs, opts, renderer="triton"):
        fn = real(gm, example_inputs, opts, renderer)
        compiled.append(fn)
        return fn
    backend._compile = spy
    try:
        if wl.startswith("tiny_"):
            wrap, model, inputs, train = _tiny(wl, dev)
            step = wrap(ember.compile(model))
            for _ in range(calls):
                if train:
                    step(*inputs).backward()
                else:
                    with torch.no_grad():
                        step(*inputs)
        else:
            sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
            import gpu_suite
            step, inputs = gpu_suite.warm_step(wl, "ember", dev=dev, warmup=calls)
    finally:
        backend._compile = real
    steady = None
    if time_it and dev.startswith("cuda"):  # the suite's method: CUDA events around N calls, median of 5
        sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
        import gpu_suite
        with torch.no_grad():
            steady = round(sorted(gpu_suite.loop_times(lambda: step(*inputs), 30, 5, True))[2], 4)
    graphs = []
    for fn in compiled:
        info = fn.ember_native
        src = open(info["wrapper"], "rb").read()
        mod = cache.load_module(info["wrapper"])
        graphs.append(dict(wrapper_sha=hashlib.sha256(src).hexdigest()[:16], hit=info["cache_hit"],
                           kernels=info["report"]["kernels"], externs=info["report"]["externs"],
                           launches=[_launch_state(s) for s in getattr(mod, "LAUNCHES", ()) if hasattr(s, "fast")]))
    from ember.native import build_pool, runtime
    pool = build_pool.get()
    return dict(workload=wl, device=dev, graphs=graphs, aot=dict(aot_cache.STATS), launch_stats=dict(runtime.STATS),
                build_workers=len(pool.procs) if pool is not None else 0, steady_ms=steady)


def comparable(rec: dict) -> dict:
    """The decisions alone: what may differ between a cold and a warm process removed (cache hits)."""
    out = json.loads(json.dumps(rec))
    for k in ("aot", "build_workers", "steady_ms"):
        out.pop(k, None)
    for g in out["graphs"]:
        g.pop("hit", None)
    return out


def main() -> int:
    import argparse
    p = argparse.ArgumentParser()
    p.add_argument("workload")
    p.add_argument("--device", default=None)
    p.add_argument("--time", action="store_true", help="also time the steady step (CUDA only)")
    a = p.parse_args()
    dev = a.device
    if dev is None:
        import torch
        dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
        os.environ.setdefault("EMBER_NATIVE_FORCE_TRITON", "1")
    rec = decisions(a.workload, dev, time_it=a.time)
    print("DECISIONS " + json.dumps(rec, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
