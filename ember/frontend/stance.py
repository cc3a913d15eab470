"""The compiler's stance: what every compiled callable consults on each call.

Two parts, as in torch.compile: the stance set with ``ember.set_stance`` is one process-wide value;
being inside an ``ember.disable``-d function (recursive) is a property of the thread running it (a
thread inside one must not make other threads' compiled calls run eagerly, and regions of several
threads may end in any order).

The hot path only compares ``current`` with ``DEFAULT`` (one global load): ``current`` is DEFAULT
while the set stance is the default and no thread is inside a disabled function; otherwise calls take
the slower path in ``FrameCache``, which asks ``effective()`` for this thread's stance.
``ember.set_stance`` and ``ember.disable`` (ember/control.py) are the public faces.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

STANCES = {
    "default": "compile on a cache miss, as usual",
    "force_eager": "ignore ember.compile: run every compiled callable's original code",
    "eager_on_recompile": "use cached compiled code whose guards pass; never compile, run eagerly instead",
    "fail_on_recompile": "use cached compiled code whose guards pass; raise instead of compiling",
    "eager_then_compile": "run each callable's first call eagerly, compile from the second call on",
}


@dataclass(frozen=True)
class Stance:
    stance: str = "default"
    skip_guard_eval_unsafe: bool = False
    force_backend: Any = None
    disabled: bool = False  # inside ember.disable(recursive=True): nothing compiles, nothing is looked up


DEFAULT = Stance()
DISABLED = Stance(disabled=True)
_SOME_THREAD_DISABLED = Stance(disabled=None)  # never returned by effective(): it only sends calls to the slow path

current: Stance = DEFAULT
_user: Stance = DEFAULT  # the set_stance value, process-wide
_threads_disabled = 0   # threads inside a disabled function now
_local = threading.local()  # .depth: this thread's nesting of disabled functions
_lock = threading.Lock()


def _refresh() -> None:
    global current
    current = _SOME_THREAD_DISABLED if _threads_disabled and _user is DEFAULT else _user


def set_current(new: Stance) -> Stance:
    """Install ``new`` as the process-wide stance; return the previous one (to restore later)."""
    global _user
    with _lock:
        prior = _user
        _user = DEFAULT if new == DEFAULT else new
        _refresh()
    return prior


def effective() -> Stance:
    """This thread's stance: DISABLED inside a disabled function, else the process-wide one."""
    return DISABLED if getattr(_local, "depth", 0) else _user


def enter_disabled() -> None:
    global _threads_disabled
    depth = getattr(_local, "depth", 0)
    _local.depth = depth + 1
    if depth == 0:
        with _lock:
            _threads_disabled += 1
            _refresh()


def exit_disabled() -> None:
    global _threads_disabled
    _local.depth -= 1
    if _local.depth == 0:
        with _lock:
            _threads_disabled -= 1
            _refresh()
