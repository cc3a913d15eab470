"""Process-wide event counters, so a test (or a user) can assert "nothing ran eagerly".

``COUNTERS["eager_fallbacks"]`` counts every time code that ember was asked to compile runs without
compilation because something failed or a limit was reached (a whole frame that cannot be traced,
the recompile limit, a graph the autograd layer could not trace, a per-size compile that failed, a
wrapper called with sizes it was not built for); ``COUNTERS["eager_fallbacks.<site>"]`` says where.
Documented behaviour that is not a failure (CPU tensors on the native backend run the ATen graph)
is not counted. Increments take a lock: fallbacks are rare, and a lost update could hide one.

Also, like the counters torch.compile keeps:

- ``backend_failures``: graphs whose backend raised while compiling them (each failure once)
- ``backend_failures_suppressed``: of those, the ones run eagerly under ``config.suppress_errors``

``ember.reset()`` leaves the counters alone; clear them yourself.
"""
from __future__ import annotations

import collections
import threading

from ember.diagnostics import logging as elog

COUNTERS: collections.Counter = collections.Counter()
_lock = threading.Lock()


def bump(name: str, n: int = 1) -> None:
    with _lock:
        COUNTERS[name] += n


def eager_fallback(site: str, reason: str) -> None:
    """Count one fallback to eager at ``site`` and log it to the graph_breaks artifact."""
    with _lock:
        COUNTERS["eager_fallbacks"] += 1
        COUNTERS[f"eager_fallbacks.{site}"] += 1
    elog.artifact("graph_breaks", f"ember: eager fallback ({site}): {reason}")


def snapshot() -> collections.Counter:
    """A copy of the counters; ``snapshot() - before`` is what happened since ``before``."""
    with _lock:
        return collections.Counter(COUNTERS)


def fallbacks() -> int:
    return COUNTERS["eager_fallbacks"]


# What was compiled: frames_compiled, graphs_compiled, recompiles (read by `ember run`'s stats and the
# tests of tests/run). Kept apart from COUNTERS, whose every key is an event a test may want to see none of.
COMPILES: collections.Counter = collections.Counter()


def bump_compiled(name: str, n: int = 1) -> None:
    with _lock:
        COMPILES[name] += n


def compiled_snapshot() -> collections.Counter:
    with _lock:
        return collections.Counter(COMPILES)
