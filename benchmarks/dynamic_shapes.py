"""GPT-2 inference over 20 sequence lengths: total wall time including every compile, for eager, ember
(default backend, dynamic=None) and torch.compile (default, dynamic=None), one fresh process each
(fresh compile caches), same inputs. Also records compiles/recompiles and the max error vs eager.

    python benchmarks/dynamic_shapes.py [--device cuda] [--lengths 20] [--small]

Writes benchmarks/results/dynamic_shapes-<device>.json and prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def _lengths(n: int, small: bool) -> list[int]:
    top = 64 if small else 512
    step = max(1, (top - 16) // n)
    return [16 + 7 + k * step for k in range(n)]  # odd sizes on purpose: no power-of-two luck


def _model(device: str, small: bool):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=128) if small else GPT2Config()
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    return GPT2LMHeadModel(cfg).to(device=device, dtype=dtype).eval()


def run_variant(variant: str, device: str, n: int, small: bool, batch: int) -> dict:
    import torch

    model = _model(device, small)
    lengths = _lengths(n, small)
    gen = torch.Generator().manual_seed(1)
    inputs = [torch.randint(0, model.config.vocab_size, (batch, s), generator=gen).to(device) for s in lengths]
    with torch.no_grad():  # kept on the device: copying logits to the host would dominate the timings
        refs = [model(input_ids=ids, use_cache=False).logits for ids in inputs]
    if variant == "eager":
        fn = model
    elif variant == "ember":
        import ember

        fn = ember.compile(model)
    else:
        fn = torch.compile(model)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    outs, per_call = [], []
    sync()
    t0 = time.perf_counter()
    with torch.no_grad():
        for ids in inputs:
            t = time.perf_counter()
            outs.append(fn(input_ids=ids, use_cache=False).logits)
            sync()
            per_call.append(time.perf_counter() - t)
    total = time.perf_counter() - t0
    errs = [float((o.float() - r.float()).abs().max()) for o, r in zip(outs, refs)]
    del outs
    # steady state: a second pass over the same lengths (everything compiled by now)
    t1 = time.perf_counter()
    with torch.no_grad():
        for ids in inputs:
            fn(input_ids=ids, use_cache=False)
    sync()
    warm = time.perf_counter() - t1
    info = {"variant": variant, "total_s": total, "second_pass_s": warm, "max_err": max(errs),
            "first_call_s": per_call[0], "lengths": lengths}
    if variant == "ember":
        cache = fn._ember_cache
        info.update(frontend_compiles=cache.compile_count, recompile_reasons=cache.recompile_reasons)
    return info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None)
    ap.add_argument("--lengths", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--small", action="store_true", help="a tiny GPT-2 (CPU smoke run)")
    ap.add_argument("--variant", help=argparse.SUPPRESS)
    ap.add_argument("--timeout", type=int, default=400)
    args = ap.parse_args()
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.variant:
        print(json.dumps(run_variant(args.variant, device, args.lengths, args.small, args.batch)))
        return
    rows = []
    for variant in ("eager", "ember", "torch.compile"):
        with tempfile.TemporaryDirectory() as tmp:  # fresh caches: cold compiles count
            env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=f"{tmp}/inductor", TRITON_CACHE_DIR=f"{tmp}/triton",
                       EMBER_CACHE_DIR=f"{tmp}/ember")
            cmd = [sys.executable, __file__, "--variant", variant, "--device", device, "--lengths",
                   str(args.lengths), "--batch", str(args.batch)] + (["--small"] if args.small else [])
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
                line = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
                rows.append(json.loads(line[-1]) if line else {"variant": variant, "error": p.stderr[-2000:]})
            except subprocess.TimeoutExpired:
                rows.append({"variant": variant, "error": f"timeout after {args.timeout} s"})
    name = torch.cuda.get_device_name().lower().replace(" ", "-") if device == "cuda" else "cpu"
    out = {"device": name, "torch": torch.__version__, "small": args.small, "batch": args.batch, "rows": rows}
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"dynamic_shapes-{'small-' if args.small else ''}{name}.json"
    path.write_text(json.dumps(out, indent=2))
    print(f"| variant | total incl. compiles (s) | second pass (s) | frontend compiles | max err |")
    print("|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['variant']} | failed: {r['error'].splitlines()[-1] if r['error'] else '?'} | | | |")
        else:
            print(f"| {r['variant']} | {r['total_s']:.2f} | {r['second_pass_s']:.3f} | "
                  f"{r.get('frontend_compiles', '-')} | {r['max_err']:.3g} |")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
