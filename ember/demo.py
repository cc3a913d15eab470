"""ember's main job: compile a small Hugging Face GPT-2 and check it against eager.

    python -m ember.demo            # eager vs ember

(Side-by-side numbers with torch.compile live in benchmarks/, which may call the peer; product
code never does.)

Builds GPT-2 (2 layers, width 128, random weights, no download), runs one batch of token ids
eagerly and through `ember.compile`, and prints: whether the logits match, how many graphs ember
compiled, the first-call (compile) time and the median time per call. Exits 1 when the outputs
do not match or ember raises.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import traceback

import torch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed_first_call(fn, ids, device):
    t0 = time.perf_counter()
    out = fn(ids)
    _sync(device)
    return out, time.perf_counter() - t0


def _round_ms(fn, ids, device, iters: int) -> float:
    """Median ms per call over ``iters`` calls (after 3 untimed ones)."""
    for _ in range(3):
        fn(ids)
    _sync(device)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter_ns()
        fn(ids)
        _sync(device)
        times.append((time.perf_counter_ns() - t0) / 1e6)
    return statistics.median(times)


def _timed_rounds(variants: dict, ids, device, iters: int, rounds: int) -> dict:
    """Per variant, the median of ``rounds`` round medians and their spread (min, max). The variants
    alternate inside every round (order flipped each round) so that a slow moment of a shared machine
    falls on both, not on whichever happened to run then."""
    per = {name: [] for name in variants}
    names = list(variants)
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            per[name].append(_round_ms(variants[name], ids, device, iters))
    return {name: (statistics.median(ms), min(ms), max(ms)) for name, ms in per.items()}


def _backend_line(device: torch.device, before, after) -> str:
    """Which code ran the compiled graphs, from the native backend's own counts."""
    ran = {k.split(".", 1)[1]: after[k] - before[k] for k in after if k.startswith("native_graphs.")}
    ran = {k: n for k, n in ran.items() if n}
    names = {"cpp": "generated C++ kernels", "triton": "generated Triton kernels", "aten": "ATen graph (eager's kernels)"}
    what = ", ".join(f"{names.get(k, k)}: {n} graph(s)" for k, n in sorted(ran.items())) or "nothing compiled"
    return f"backend: ember (native) on {device.type}; {what}"


def build_model(device: torch.device, use_cache: bool):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1000, n_positions=256,
                     bos_token_id=0, eos_token_id=0)  # GPT-2's 50256 is outside this vocabulary
    cfg.use_cache = use_cache
    model = GPT2LMHeadModel(cfg).to(device).eval()
    ids = torch.randint(0, cfg.vocab_size, (2, 64), device=device)
    return model, ids


def _logits(model):
    def step(ids):
        with torch.no_grad():
            return model(ids).logits
    return step


def _describe_cache(compiled) -> list[str]:
    """What ember's cache says about the compiled forward; tolerant of a partial API."""
    import ember

    lines = []
    try:
        cache = ember.testing.cache_of(compiled)
    except Exception as exc:  # AttributeError while the API grows, or anything it raises
        return [f"cache info unavailable ({type(exc).__name__}: {exc})"]
    for label, attr in (("cache entries", "entries"), ("compiles", "compile_count")):
        try:
            value = getattr(cache, attr)
            lines.append(f"{label}: {len(value) if isinstance(value, list) else value}")
        except AttributeError:
            pass
    try:
        reasons = cache.recompile_reasons
        lines.append(f"recompiles: {len(reasons)}")
        lines.extend(f"  - {r}" for r in reasons)
    except AttributeError:
        pass
    return lines


def _count_graphs(model, ids) -> str:
    """Compile a second time with a counting backend: graphs = backend calls for one forward."""
    import ember

    try:
        counter = ember.testing.CompileCounter()
        _logits(ember.compile(model, backend=counter))(ids)
    except Exception as exc:
        return f"graph count unavailable ({type(exc).__name__}: {exc})"
    frames = getattr(counter, "frame_count", "?")
    ops = getattr(counter, "op_count", "?")
    if frames == 0:
        return "graphs compiled: 0 with a counting backend (did it reuse the first compile's cache?)"
    breaks = f", graph breaks: {frames - 1}" if isinstance(frames, int) else ""
    return f"graphs compiled: {frames} (ops in graphs: {ops}){breaks}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ember.demo", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--iters", type=int, default=10, help="timed calls per variant in each round")
    p.add_argument("--rounds", type=int, default=7, help="timing rounds (eager and ember alternate in each)")
    p.add_argument("--use-cache", action="store_true", help="return the KV cache too (harder to capture)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads, fixed for both variants (default: all cores, at most 8)")
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads or min(8, os.cpu_count() or 1))
    device = torch.device(args.device)
    tol = dict(rtol=1e-3, atol=1e-3) if device.type == "cuda" else dict(rtol=1e-4, atol=1e-4)
    model, ids = build_model(device, args.use_cache)
    print(f"torch {torch.__version__}, python {sys.version.split()[0]}, device {device},"
          f" {torch.get_num_threads()} CPU threads"
          + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""))
    print(f"model: GPT-2 2 layers, n_embd 128, {sum(t.numel() for t in model.parameters()):,} params;"
          f" input ids {tuple(ids.shape)}")

    eager = _logits(model)
    ref, _ = _timed_first_call(eager, ids, device)

    try:
        import ember
        from ember.diagnostics import counters

        print(f"ember {ember.__version__}")
        compiled_before = counters.compiled_snapshot()
        compiled = ember.compile(model)
        step = _logits(compiled)
        out, first = _timed_first_call(step, ids, device)
        again = step(ids)  # a second call must hit the cache and agree too
    except Exception as exc:
        print("\nFAIL: ember raised while compiling or running the model:", file=sys.stderr)
        traceback.print_exc()
        print(f"\nRESULT: FAIL ({type(exc).__name__}: {exc})")
        return 1

    ok = True
    for name, got in (("first call", out), ("second call", again)):
        diff = (got.float() - ref.float()).abs().max().item()
        try:
            torch.testing.assert_close(got, ref, **tol)
            print(f"{name}: logits match eager (max abs diff {diff:.3g})")
        except AssertionError as exc:
            ok = False
            print(f"{name}: logits DO NOT match eager (max abs diff {diff:.3g})\n{exc}")

    print(_backend_line(device, compiled_before, counters.compiled_snapshot()))
    for line in _describe_cache(compiled):
        print(line)
    print(_count_graphs(model, ids))

    try:
        timed = _timed_rounds({"eager": eager, "ember": step}, ids, device, args.iters, args.rounds)
    except Exception as exc:
        print("\nFAIL: ember raised on a repeated call:", file=sys.stderr)
        traceback.print_exc()
        print(f"\nRESULT: FAIL ({type(exc).__name__}: {exc})")
        return 1

    base = timed["eager"][0]
    print(f"\n{args.rounds} rounds of {args.iters} calls, eager and ember alternating, "
          f"{torch.get_num_threads()} CPU threads")
    print(f"{'variant':<10} {'first call s':>12} {'median ms/call':>15} {'spread (min-max)':>18} {'vs eager':>9}")
    for name, first_s in (("eager", None), ("ember", first)):
        ms, lo, hi = timed[name]
        first_txt = "-" if first_s is None else f"{first_s:.2f}"
        print(f"{name:<10} {first_txt:>12} {ms:>15.3f} {f'{lo:.3f}-{hi:.3f}':>18} {base / ms:>8.2f}x")

    print("\nRESULT:", "PASS" if ok else "FAIL (outputs differ from eager)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
