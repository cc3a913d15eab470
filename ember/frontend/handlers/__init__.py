"""Opcode handlers: one function per opcode, registered with the Python versions it applies to.

``HANDLERS`` maps opcode name -> handler for the running interpreter only, so version differences
live in the registrations rather than in ``if sys.version_info`` branches.
"""
from __future__ import annotations

from typing import Callable

from ember.frontend.bytecode import PY
from ember.frontend.errors import Unsupported

HANDLERS: dict[str, Callable] = {}


def register(*opnames: str, versions: tuple = ((3, 11), (3, 13))):
    """Register a handler for ``opnames`` on Python versions ``versions[0]`` through ``versions[1]``.

    The default covers every version whose semantics for the opcode are the same; an opcode whose
    stack effect or argument changed gets one registration per range (e.g. 3.13's CALL)."""
    lo, hi = versions

    def deco(fn):
        if lo <= PY <= hi:
            for name in opnames:
                HANDLERS[name] = fn
        return fn

    return deco


def unsupported(*opnames: str, reason: str):
    def handler(tx, inst):
        raise Unsupported(f"{reason} ({inst.opname})")

    for name in opnames:
        HANDLERS[name] = handler


from ember.frontend.handlers import (  # noqa: E402,F401  (registration side effects)
    arithmetic, blocks, calls, containers, jumps, loads_stores, py313,
)
