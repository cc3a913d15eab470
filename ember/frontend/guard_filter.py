"""User control over guards: ``options={"guard_filter_fn": f}``.

``f`` receives one ``GuardFilterEntry`` per guard of a new cache entry and returns one bool per entry
(keep it or drop it), the protocol torch.compile uses, with torch's guard-type names so filters
written for torch.compile work unchanged. Dropping guards is unsafe by design: the entry then runs
for inputs it was not traced for. The ``*_unsafe`` helpers below are the common filters.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from ember.frontend.guards import Guard, GuardKind

# ember's guard kinds under the names torch.compile's guard filters test for
TORCH_GUARD_TYPES = {
    GuardKind.TENSOR: "TENSOR_MATCH",
    GuardKind.CONST: "EQUALS_MATCH",
    GuardKind.ID: "ID_MATCH",
    GuardKind.TYPE: "TYPE_MATCH",
    GuardKind.LEN: "LENGTH_CHECK",
    GuardKind.DICT_KEYS: "DICT_KEYS_MATCH",
    GuardKind.NO_HOOKS: "NN_MODULE_HOOKS",
    GuardKind.ALIAS: "OBJECT_ALIASING",
    GuardKind.NOT_ALIAS: "OBJECT_ALIASING",
    GuardKind.GLOBAL_STATE: "GLOBAL_STATE",
    GuardKind.SHAPE: "SHAPE_ENV",
    GuardKind.STORAGE_OFFSET: "TENSOR_MATCH",  # torch.compile checks offsets as part of the tensor match
    GuardKind.NO_ATTR: "HASATTR",
}


@dataclass(frozen=True)
class GuardFilterEntry:
    name: str                      # how users read the guarded value: "x", "self.fc.weight", "global SCALE"
    has_value: bool
    value: Any                     # the guarded object at compile time (None if not readable)
    guard_type: str                # torch's name, e.g. "TENSOR_MATCH"
    derived_guard_types: tuple
    is_global: bool                # reached through a module global
    orig_guard: Guard
    is_nn_module: bool = False     # the value is, or is reached through, an nn.Module
    is_builtin_nn_module: bool = False  # ... through a module class of torch.nn (Linear, LayerNorm...)


def _chain(source):
    out = []
    while source is not None:
        out.append(source)
        source = source.base()
    return out[::-1]


def make_entries(guards, evaluate: Callable) -> list[GuardFilterEntry]:
    entries = []
    for g in guards:
        name, value, has_value, is_global, in_mod, in_builtin = "global state", None, False, False, False, False
        if g.kind is GuardKind.SHAPE:
            name = "symbolic sizes"
        if g.source is not None:
            name = g.source.name()
            is_global = g.source.is_global()
            try:
                value, has_value = evaluate(g.source), True
            except Exception:
                pass
            for src in _chain(g.source):
                try:
                    obj = evaluate(src)
                except Exception:
                    continue
                if isinstance(obj, torch.nn.Module):
                    in_mod = True
                    in_builtin = in_builtin or type(obj).__module__.startswith("torch.nn.")
        kind = TORCH_GUARD_TYPES[g.kind]
        entries.append(GuardFilterEntry(name, has_value, value, kind, (kind,), is_global, g, in_mod, in_builtin))
    return entries


def apply(guards, fn: Callable, evaluate: Callable) -> list[Guard]:
    """The guards ``fn`` keeps."""
    entries = make_entries(guards, evaluate)
    keep = list(fn(entries))
    if len(keep) != len(entries):
        raise ValueError(f"guard_filter_fn returned {len(keep)} flags for {len(entries)} guard entries; "
                         "it must return one bool per entry")
    return [e.orig_guard for e, k in zip(entries, keep) if k]


# ---- the helpers torch.compiler offers, same names and meaning --------------------------------
def skip_guard_on_inbuilt_nn_modules_unsafe(guard_entries):
    """Drop guards on torch.nn's own modules (their parameters, hooks, identity)."""
    return [not e.is_builtin_nn_module for e in guard_entries]


def skip_guard_on_all_nn_modules_unsafe(guard_entries):
    """Drop guards on every nn.Module and what is reached through one."""
    return [not e.is_nn_module for e in guard_entries]


def keep_tensor_guards_unsafe(guard_entries, keep_parameters: bool = False):
    """Keep only tensor guards (and, unless ``keep_parameters``, not those on nn.Parameters)."""
    return [e.guard_type == "TENSOR_MATCH" and (keep_parameters or not isinstance(e.value, torch.nn.Parameter))
            for e in guard_entries]


def skip_guard_on_globals_unsafe(guard_entries):
    """Drop guards on module globals."""
    return [not e.is_global for e in guard_entries]


def skip_all_guards_unsafe(guard_entries):
    """Drop every guard: the first entry runs for any input."""
    return [False for _ in guard_entries]
