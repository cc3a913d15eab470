"""``ember.export.export`` and the file-format aliases ``save``/``load`` (torch.export's .pt2 archive)."""
from __future__ import annotations

import torch
from torch.export import Dim as Dim  # ember.export.Dim is torch.export.Dim: one Dim for both
from torch.export import ExportedProgram as ExportedProgram

from ember.export.capture import ExportError, capture
from ember.export.program import build_program


def export(mod: torch.nn.Module, args: tuple, kwargs: dict | None = None, *, dynamic_shapes=None,
           strict: bool = True) -> ExportedProgram:
    """Capture ``mod.forward(*args, **kwargs)`` whole and return a ``torch.export.ExportedProgram``.

    The forward is traced by ember's frontend with no graph breaks allowed: a construct it cannot
    capture (a branch on a tensor's value, ``print``, ``.item()``...) raises ``ExportError`` naming it
    and the user's file:line. The graph is functionalized to ATen by ember's autograd layer;
    parameters, buffers and tensor constants become inputs (``ep.graph_signature``), in-place updates
    of buffers and inputs become mutation outputs.

    ``dynamic_shapes``: as in torch.export, a dict by forward argument name (or a tuple matching
    ``args``) giving per tensor ``{dim: Dim(...)}`` or a list of ``Dim``/None. The program is traced
    once for every size in each Dim's range; ``ep.range_constraints`` records the ranges and
    ``ep.module()`` checks them. ``strict`` is accepted for torch.export compatibility: ember always
    captures through its own frontend (the equivalent of strict mode).
    """
    if not isinstance(mod, torch.nn.Module):
        raise ExportError(f"ember.export.export expects an nn.Module, got {type(mod).__name__}; wrap a function "
                          "in a Module whose forward calls it")
    if not isinstance(args, tuple):
        raise ExportError(f"ember.export.export: args must be a tuple of example inputs, got {type(args).__name__} "
                          "(for one input write (x,))")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise ExportError(f"ember.export.export: kwargs must be a dict, got {type(kwargs).__name__}")
    if type(strict) is not bool:
        raise ExportError(f"ember.export.export: strict must be True or False, got {strict!r}")
    kwargs = dict(kwargs or {})
    cap = capture(mod, args, kwargs, dynamic_shapes)
    return build_program(mod, cap, args, kwargs)


def save(ep: ExportedProgram, f, **kwargs) -> None:
    """``torch.export.save``: the .pt2 archive any torch can ``torch.export.load``."""
    torch.export.save(ep, f, **kwargs)


def load(f, **kwargs) -> ExportedProgram:
    """``torch.export.load``."""
    return torch.export.load(f, **kwargs)
