"""Helpers shared by the benchmark scripts that run one measured process per case."""
from __future__ import annotations

import contextlib


@contextlib.contextmanager
def exclusive_lock(path: str | None):
    """Held while timing, so parallel jobs never share the device during a measurement (their
    compiles may still overlap). No path: no lock."""
    if not path:
        yield
        return
    import fcntl

    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
