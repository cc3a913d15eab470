"""The compiler's stance: one process-wide value that every compiled callable consults on each call.

The hot path only compares ``current`` with ``DEFAULT`` (one global load); every other stance takes
the slower path in ``FrameCache``. ``ember.set_stance`` (ember/control.py) is the public face.
"""
from __future__ import annotations

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

current: Stance = DEFAULT


def set_current(new: Stance) -> Stance:
    """Install ``new``; return the previous stance (to restore later)."""
    global current
    prior = current
    current = DEFAULT if new == DEFAULT else new
    return prior
