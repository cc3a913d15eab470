"""Capture a module's whole forward with ember's frontend, for ``ember.export.export``.

The module is compiled with ``fullgraph=True`` and a recording backend, then called once on clones of
the example inputs: the frontend traces the bytecode into one torch-level FX graph (any construct it
cannot capture raises, naming the construct and the user's file:line), and the recording backend
keeps that graph, its real example inputs and the real outputs of the call. The module's state is
restored afterwards, so exporting never changes the model (a buffer mutated in forward is only
recorded, as a mutation output of the exported program).

Dynamic dimensions (``torch.export.Dim``) become ``ember.mark_dynamic`` marks with the Dim's range
on the clones; everything else is traced static (``dynamic=False``).
"""
from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass, field

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from ember.control import exporting
from ember.frontend.dynamic import ConstraintViolation, mark_dynamic
from ember.frontend.errors import CompileError


class ExportError(CompileError):
    """``ember.export.export`` could not capture the program as one graph, or was called wrongly.
    The message names the construct and the user's file:line (from the frontend)."""


@dataclass
class Capture:
    gm: fx.GraphModule              # torch-level graph, one placeholder per tensor the forward reads
    example_inputs: list            # the real values behind the placeholders, in order
    graph_outputs: tuple            # what the graph returned for those inputs (real tensors)
    output: object                  # what the forward returned (a pytree; its tensors come from above)
    user_leaves: list               # flattened (args, kwargs) clones, in the order of in_spec
    in_spec: pytree.TreeSpec
    dim_names: dict = field(default_factory=dict)  # "x.size(0)" -> Dim name, for error messages


# ---------------------------------------------------------------------------------- dynamic_shapes

def _dim_like(value) -> bool:
    return hasattr(value, "__name__") and hasattr(value, "min") and hasattr(value, "max") or \
        type(value).__name__ in ("_Dim", "Dim", "_DerivedDim", "_StaticDim", "_DimHint")


def _dims_of(spec, tensor: torch.Tensor, where: str) -> dict:
    """{dim index: Dim} from one tensor's entry of ``dynamic_shapes`` (a dict or a list/tuple)."""
    if spec is None:
        return {}
    if isinstance(spec, dict):
        items = spec.items()
    elif isinstance(spec, (list, tuple)):
        if len(spec) != tensor.dim():
            raise ExportError(f"dynamic_shapes{where} has {len(spec)} entries but the tensor has {tensor.dim()} "
                              "dimensions; give one entry (a Dim or None) per dimension, or a {dim: Dim} dict")
        items = enumerate(spec)
    else:
        raise ExportError(f"dynamic_shapes{where} must be a dict {{dim: Dim}} or a list of Dim/None, got "
                          f"{type(spec).__name__}")
    out = {}
    for d, dim in items:
        if dim is None:
            continue
        if not isinstance(d, int) or not -tensor.dim() <= d < tensor.dim():
            raise ExportError(f"dynamic_shapes{where}: dimension {d!r} is out of range for a {tensor.dim()}-d tensor")
        if type(dim).__name__ == "_DerivedDim":
            raise ExportError(f"dynamic_shapes{where}[{d}]: derived dims ({dim.__name__}) are not supported by "
                              "ember.export yet; use a plain Dim")
        if not _dim_like(dim):
            raise ExportError(f"dynamic_shapes{where}[{d}] must be a torch.export.Dim or None, got {dim!r}")
        out[d % tensor.dim()] = dim
    return out


def _spec_for_args(mod, args: tuple, kwargs: dict, dynamic_shapes):
    """dynamic_shapes keyed like (args, kwargs): accepts a dict by forward argument name (torch's
    usual form) or a tuple/list matching ``args`` (then kwargs by name)."""
    if dynamic_shapes is None:
        return [None] * len(args), {k: None for k in kwargs}
    if isinstance(dynamic_shapes, dict):
        sig = inspect.signature(mod.forward)
        bound = sig.bind(*args, **kwargs)
        names = list(bound.arguments)
        unknown = [k for k in dynamic_shapes if k not in names]
        if unknown:
            raise ExportError(f"dynamic_shapes names {unknown}, which are not arguments of "
                              f"{type(mod).__name__}.forward{sig}; key it by those argument names")
        arg_specs = [dynamic_shapes.get(n) for n in names[:len(args)]]
        return arg_specs, {k: dynamic_shapes.get(k) for k in kwargs}
    if isinstance(dynamic_shapes, (list, tuple)):
        specs = list(dynamic_shapes)
        if len(specs) != len(args) + len(kwargs):
            if len(specs) != len(args):
                raise ExportError(f"dynamic_shapes has {len(specs)} entries for {len(args)} positional arguments")
            return specs, {k: None for k in kwargs}
        return specs[:len(args)], dict(zip(kwargs, specs[len(args):]))
    raise ExportError(f"dynamic_shapes must be a dict (by argument name), a tuple or None, got "
                      f"{type(dynamic_shapes).__name__}")


def _apply_marks(value, spec, where: str, names: dict, labels: list):
    """Clone the tensors of one argument, marking the dynamic dims its spec names."""
    if isinstance(value, torch.Tensor):
        clone = value.detach().clone()
        for d, dim in _dims_of(spec, value, where).items():
            lo, hi = _bounds(dim)
            if (lo is not None and value.shape[d] < lo) or (hi is not None and value.shape[d] > hi):
                raise ExportError(f"Constraints violated ({dim.__name__})! The example input{where} has size "
                                  f"{value.shape[d]} in dimension {d}, outside the range of {dim.__name__} "
                                  f"[{lo}, {hi}]; pass an example inside the range or widen the Dim")
            mark_dynamic(clone, d, min=lo, max=hi)
            labels.append((clone, d, dim.__name__))
        return clone
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        subs = spec if isinstance(spec, (list, tuple)) and len(spec) == len(value) else [None] * len(value)
        return type(value)(_apply_marks(v, s, f"{where}[{i}]", names, labels) for i, (v, s) in enumerate(zip(value, subs)))
    if isinstance(value, dict):
        subs = spec if isinstance(spec, dict) else {}
        return {k: _apply_marks(v, subs.get(k), f"{where}[{k!r}]", names, labels) for k, v in value.items()}
    return pytree.tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, value)


def _bounds(dim):
    lo, hi = getattr(dim, "min", None), getattr(dim, "max", None)
    big = 2 ** 62  # torch's Dim uses int_oo / sys.maxsize-ish for "no upper bound"
    lo = None if lo is None or lo <= 0 else int(lo)
    hi = None if hi is None or hi >= big or str(hi) in ("oo", "int_oo") else int(hi)
    return lo, hi


# ---------------------------------------------------------------------------------------- capture

@contextlib.contextmanager
def _state_restored(mod: torch.nn.Module):
    """Run the capture call without leaving a trace on the module: buffers (and parameters) that
    forward mutates get their old values back."""
    saved = {k: v.detach().clone() for k, v in [*mod.named_parameters(), *mod.named_buffers()]}
    try:
        yield
    finally:
        with torch.no_grad():
            for k, v in [*mod.named_parameters(), *mod.named_buffers()]:
                if k in saved and v.shape == saved[k].shape:
                    v.copy_(saved[k])


def capture(mod: torch.nn.Module, args: tuple, kwargs: dict, dynamic_shapes) -> Capture:
    import ember  # the public ember.compile (late: ember/__init__ imports this package lazily)

    arg_specs, kw_specs = _spec_for_args(mod, args, kwargs, dynamic_shapes)
    labels: list = []
    c_args = tuple(_apply_marks(a, s, f"[{i}]", {}, labels) for i, (a, s) in enumerate(zip(args, arg_specs)))
    c_kwargs = {k: _apply_marks(v, kw_specs.get(k), f"[{k!r}]", {}, labels) for k, v in kwargs.items()}
    leaves, in_spec = pytree.tree_flatten((c_args, c_kwargs))
    recorded: dict = {}

    def record(gm, example_inputs):
        if "gm" in recorded:
            raise ExportError("ember.export: the frontend produced more than one graph; this is an ember bug")
        recorded["gm"], recorded["inputs"] = gm, list(example_inputs)

        def run(*inputs):
            out = gm.forward(*inputs)
            recorded["outputs"] = tuple(out) if isinstance(out, (tuple, list)) else (out,)
            return out
        return run

    compiled = ember.compile(mod, backend=record, fullgraph=True, dynamic=False)
    name = type(mod).__name__
    try:
        with exporting(), _state_restored(mod), torch.no_grad():
            output = compiled(*c_args, **c_kwargs)
    except ConstraintViolation as exc:
        raise ExportError(_name_dims(f"Constraints violated! {exc}", labels)) from exc
    except CompileError as exc:
        reason = str(exc.__cause__) if exc.__cause__ is not None else str(exc)
        raise ExportError(f"ember.export cannot capture {name}.forward as one graph: {reason}") from exc
    if "gm" not in recorded:
        raise ExportError(f"ember.export: {name}.forward does no tensor work to export (no graph was captured)")
    dim_names = {}
    return Capture(recorded["gm"], recorded["inputs"], recorded.get("outputs", ()), output, leaves, in_spec, dim_names)


def _name_dims(message: str, labels: list) -> str:
    names = sorted({n for _, _, n in labels})
    if names:
        message = message.replace("Constraints violated!", f"Constraints violated ({', '.join(names)})!", 1)
    return message
