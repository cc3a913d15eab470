"""Timing and output comparison shared by ``ember bench``, ``benchmarks/bench_peer.py`` and the model zoo.

Timing: ``warmup`` calls, then ``iters`` calls each timed alone (on CUDA, synchronised after each), and
the median in milliseconds. The median rather than the mean, because a shared machine throws the
odd slow call (a page fault, another process) that would drag a mean up; and variants are timed in
turns, so that load which comes and goes hits eager and compiled alike.

Comparison: both outputs are flattened into (path, leaf) pairs — through tuples, lists, dicts
(Hugging Face ``ModelOutput`` is a dict) and Hugging Face caches (``.layers[i].keys/values``) — and
each container contributes its type name, so a different structure is a mismatch, not a shorter zip.
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch


def sync(device: str | torch.device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def first_call(fn: Callable[[], Any], device) -> tuple[Any, float]:
    """Run ``fn`` once; return its output and the wall time in seconds (for a fresh compile: the compile)."""
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - t0


def median_ms(fns: dict[str, Callable[[], Any]], device, warmup: int, iters: int) -> dict[str, dict]:
    """Per name: the median, minimum and count of per-call times in ms, after ``warmup`` untimed calls each.

    The callables are timed in turns (a, b, a, b, ...), so that a burst of load from another process
    slows each of them alike instead of skewing the ratio between them.
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    sync(device)
    times: dict[str, list] = {name: [] for name in fns}
    for _ in range(max(1, iters)):
        for name, fn in fns.items():
            t0 = time.perf_counter_ns()
            fn()
            sync(device)
            times[name].append((time.perf_counter_ns() - t0) / 1e6)
    return {name: {"ms": statistics.median(ts), "min_ms": min(ts), "iters": len(ts)} for name, ts in times.items()}


def leaves(obj: Any, path: str = "out") -> list[tuple[str, Any]]:
    """(path, value) pairs of every tensor and scalar in ``obj``; containers add ("path", "<type Name>")."""
    if isinstance(obj, torch.Tensor):
        return [(path, obj)]
    if isinstance(obj, dict):
        items = [(f"{path}[{k!r}]", v) for k, v in obj.items()]
    elif isinstance(obj, (list, tuple)):
        items = [(f"{path}[{i}]", v) for i, v in enumerate(obj)]
    elif hasattr(obj, "layers") and hasattr(obj, "get_seq_length"):  # a transformers Cache
        items = [(f"{path}.layers[{i}].{name}", getattr(layer, name, None))
                 for i, layer in enumerate(obj.layers) for name in ("keys", "values")]
    elif hasattr(obj, "self_attention_cache") and hasattr(obj, "cross_attention_cache"):  # EncoderDecoderCache
        items = [(f"{path}.{name}", getattr(obj, name)) for name in ("self_attention_cache", "cross_attention_cache")]
    else:
        return [(path, obj)]
    out = [(path, f"<type {type(obj).__name__}>")]
    for p, v in items:
        out += leaves(v, p)
    return out


def compare(expected: Any, actual: Any, rtol: float, atol: float) -> tuple[bool, float, str]:
    """(match, max abs error over all tensors, first difference or "") of two outputs."""
    exp, act = leaves(expected), leaves(actual)
    if len(exp) != len(act):
        return False, float("nan"), f"{len(act)} output leaves, eager has {len(exp)}"
    worst, first = 0.0, ""
    for (path, e), (_, a) in zip(exp, act):
        if isinstance(e, torch.Tensor) != isinstance(a, torch.Tensor):
            return False, float("nan"), f"{path}: {type(a).__name__} where eager has {type(e).__name__}"
        if not isinstance(e, torch.Tensor):
            if e != a and not first:
                first = f"{path}: {a!r} != {e!r}"
            continue
        if e.shape != a.shape or e.dtype != a.dtype:
            return False, float("nan"), f"{path}: {a.dtype}{list(a.shape)} vs eager {e.dtype}{list(e.shape)}"
        if e.numel() == 0:
            continue
        e64, a64 = e.detach().double(), a.detach().double().to(e.device)
        diff = torch.where(e64.isnan() & a64.isnan(), 0.0, (e64 - a64).abs()).max().item()  # NaN where eager has none
        worst = diff if diff != diff or worst != worst else max(worst, diff)  # x != x: NaN sticks
        if not first and not torch.allclose(a64, e64, rtol=rtol, atol=atol, equal_nan=True):
            first = f"{path}: max abs error {diff:.3g} above atol {atol:g} + rtol {rtol:g}"
    return not first, worst, first


def tolerance(device, dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) for comparing a compiled result with eager: fused kernels reorder float sums."""
    if dtype in (torch.float16, torch.bfloat16):
        return 2e-2, 2e-2
    return (1e-3, 1e-3) if torch.device(device).type == "cuda" else (1e-4, 1e-4)
