"""The threaded stress workload shared by the fast (CI) and slow stress tests.

Each thread calls compiled functions many times with a few input shapes (so entries are compiled,
recompiled and turned dynamic while other threads call them), compares every result with eager, and
the run fails on any eager fallback: ember's counters (``ember.diagnostics.counters``), any warning,
or the openvino backends' own fallback log lines (that package is outside these counters).
"""
from __future__ import annotations

import contextlib
import logging
import threading
import warnings

import torch

import ember
from ember.diagnostics.counters import snapshot

# the openvino backend logs these when a partition or a graph runs in PyTorch instead
OV_FALLBACK_MARKS = ("runs in PyTorch from now on", "OpenVINO failed")


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 16)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        return self.fc2(h).sigmoid() * x + x.mean(dim=-1, keepdim=True)


def pointwise(x, y):
    return (x * 2 + y).tanh() - y.abs().sum(-1, keepdim=True)


def programs(backend: str, device: str = "cpu") -> list:
    """(name, compiled callable, eager callable, make_args(rng_gen, k)): a module; a function whose
    batch size changes (automatic dynamic after the second size); one compiled with dynamic=True."""
    torch.manual_seed(0)
    block = Block().eval().to(device)
    # float32 results on CPU: OpenVINO's default there is bf16 inference (and it warns)
    kw = {"options": {"config": {"INFERENCE_PRECISION_HINT": "f32"}}} if backend == "openvino" else {}
    sizes = (2, 5, 9)

    def block_args(g, k):
        return (torch.randn(sizes[k % 3], 16, generator=g).to(device),)

    def pw_args(g, k):
        n = sizes[(k // 2) % 3]
        return torch.randn(n, 8, generator=g).to(device), torch.randn(n, 8, generator=g).to(device)

    return [
        ("module", ember.compile(block, backend=backend, **kw), block, block_args),
        ("function", ember.compile(pointwise, backend=backend, **kw), pointwise, pw_args),
        ("dynamic", ember.compile(lambda x, y: pointwise(x, y) * 3, backend=backend, dynamic=True, **kw),
         lambda x, y: pointwise(x, y) * 3, pw_args),
    ]


@contextlib.contextmanager
def openvino_fallbacks():
    """Collect the openvino artifact's fallback messages while the block runs."""
    seen: list[str] = []

    class Grab(logging.Handler):
        def emit(self, record):
            msg = record.getMessage()
            if any(m in msg for m in OV_FALLBACK_MARKS):
                seen.append(msg)

    from ember.diagnostics import logging as elog
    log = elog.get_logger("openvino")  # configured now: its first use would reset the level set here
    grab, old_level = Grab(), log.level
    log.addHandler(grab)
    log.setLevel(logging.DEBUG)  # the artifact logs at DEBUG only when enabled
    try:
        yield seen
    finally:
        log.removeHandler(grab)
        log.setLevel(old_level)


def run(backend: str, n_threads: int, n_calls: int, device: str = "cpu") -> dict:
    """Run the workload on ``device``; return {"mismatches": [...], "errors": [...], "fallbacks": Counter,
    "warnings": [...], "openvino_fallbacks": [...]}: all empty on success."""
    progs = programs(backend, device)
    barrier = threading.Barrier(n_threads)
    mismatches, errors = [], []
    before = snapshot()

    def body(i):
        g = torch.Generator().manual_seed(1000 + i)
        try:
            barrier.wait()
            with torch.no_grad():
                for k in range(n_calls):
                    name, compiled, eager, make_args = progs[(i + k) % len(progs)]
                    args = make_args(g, k + i)
                    got, want = compiled(*args), eager(*args)
                    if not torch.allclose(got, want, rtol=1e-4, atol=1e-5):
                        mismatches.append(f"thread {i} call {k} {name} {[tuple(a.shape) for a in args]}: "
                                          f"max diff {(got - want).abs().max().item():.3g}")
        except BaseException as e:  # noqa: BLE001 - reported to the caller
            errors.append(f"thread {i}: {type(e).__name__}: {e}")

    with warnings.catch_warnings(record=True) as caught, openvino_fallbacks() as ov:
        warnings.simplefilter("always")
        threads = [threading.Thread(target=body, args=(i,)) for i in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return {"mismatches": mismatches[:10], "errors": errors[:10], "fallbacks": dict(snapshot() - before),
            "warnings": [str(w.message) for w in caught][:10], "openvino_fallbacks": ov[:10]}


def check(result: dict) -> None:
    bad = {k: v for k, v in result.items() if v}
    assert not bad, f"threaded run failed: {bad}"
