"""Helpers shared by the benchmark scripts that run one measured process per case."""
from __future__ import annotations

import contextlib


@contextlib.contextmanager
def exclusive_lock(path: str | None):
    """Held around a measurement, so parallel jobs never share the machine during it. No path: no
    lock."""
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
