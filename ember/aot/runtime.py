"""Run compiled ATen graphs with the captured graph's exact semantics.

A *variant* is one compiled form of a captured graph for one autograd situation:

- ``InferenceVariant``: grad mode off, or no input needs a gradient. Calls the compiled forward, then
  the epilogue: copy new values into mutated inputs, rebuild the user's outputs.
- ``TrainingVariant``: some input needs a gradient. The compiled forward and backward run inside one
  ``torch.autograd.Function``; the epilogue runs outside it, under autograd, so that copying into a
  mutated input and regenerating views of inputs are recorded like the eager ops they stand for.
- ``EagerVariant``: the captured graph as it is, for the rare semantics the traced graphs cannot hold
  (``analysis.GraphMeta.unsupported`` says which).
"""
from __future__ import annotations

import contextlib
from typing import Callable

import torch
import torch.fx as fx

from ember.aot.analysis import GraphMeta, OutputKind
from ember.aot.reinplace import reinplace as reinplace_pass

DOUBLE_BACKWARD_ERROR = (
    b"ember: this gradient was computed by a compiled (aot_autograd) backward graph, which cannot be "
    b"differentiated again: double backward / create_graph=True higher-order gradients are not supported "
    b"through compiled graphs. First-order gradients taken with create_graph=True are correct; to "
    b"differentiate them, run this region eagerly (backend='eager')."
)


# (read at every call of a compiled graph: one global load each, not a chain of attribute lookups)
_any_autocast = torch._C._is_any_autocast_enabled
_grad_enabled = torch.is_grad_enabled
_set_grad_enabled = torch._C._set_grad_enabled


def _autocast_off():
    """The traced graphs already contain autocast's casts; an autocast region around the call must not
    cast their ops a second time."""
    return torch._C._DisableAutocast() if torch._C._is_any_autocast_enabled() else contextlib.nullcontext()


# ------------------------------------------------------------------------------- boxed calling convention
#
# A compiled graph called as f(*args) cannot free its inputs early: the caller's argument tuple keeps
# them alive until it returns. A callable marked ``_boxed_call = True`` instead takes one list and
# empties it once it has read its inputs, so e.g. each saved activation dies right after its last use
# in the backward, as it does in eager autograd. Compilers may return either kind.

class BoxedCodeGen(fx.graph.CodeGen):
    """FX code generation for ``forward(self, args_list)``: unpack the list, then clear it."""

    def gen_fn_def(self, free_vars, maybe_return_annotation, **kwargs):
        names = [v.split(":")[0].split("=")[0].strip() for v in free_vars if v != "self"]
        lines = [f"def {getattr(self, '_func_name', 'forward')}(self, args_list){maybe_return_annotation}:"]
        if names:
            lines.append(f"    {', '.join(names)}, = args_list")
            lines.append("    args_list.clear()")
        return "\n".join(lines)


def boxed(gm: fx.GraphModule, reinplace: bool = False) -> Callable:
    """A boxed callable running a copy of ``gm`` (the original keeps its readable signature), with
    dead buffers reused by in-place ops if ``reinplace`` (see ``reinplace.py``)."""
    graph = fx.Graph()
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    graph.set_codegen(BoxedCodeGen())
    runner = fx.GraphModule(gm, graph, class_name=f"{type(gm).__name__}_boxed")
    if reinplace:
        runner.meta["ember_reinplaced"] = reinplace_pass(runner)
    fn = runner.forward
    fn.__func__._boxed_call = True
    return fn


def call_compiled(fn: Callable, args: list):
    return fn(args) if getattr(fn, "_boxed_call", False) else fn(*args)


def _copy_plan(meta: GraphMeta) -> tuple:
    """(mutations written back together, the others) as (traced position, input index) pairs.

    Copies that autograd does not record (made under no_grad, or of a value needing no gradient into
    an input needing none: batch norm's running statistics, 161 buffers in a ResNet-50 step) are
    done by one ``_foreach_copy_``: one call and a few kernel launches instead of one of each per
    buffer. Inputs that share memory with a mutated one never reach a compiled variant
    (``analysis.unsupported``), so the copies cannot overlap."""
    plan = meta.__dict__.get("_ember_copy_plan")
    if plan is None:
        def unrecorded(k, i):
            info = meta.inputs[i]
            return info.mutation.under_no_grad or not (info.requires_grad or meta.traced_requires_grad[k])
        quiet = [(k, i) for k, i in enumerate(meta.mutated) if unrecorded(k, i)]
        rest = [(k, i) for k, i in enumerate(meta.mutated) if not unrecorded(k, i)]
        if len(quiet) < 2:
            quiet, rest = [], [(k, i) for k, i in enumerate(meta.mutated)]
        plan = meta.__dict__["_ember_copy_plan"] = (tuple(quiet), tuple(rest))
    return plan


def _copy_groups(pairs, args, traced) -> tuple:
    """``pairs`` grouped by (destination dtype, device, source dtype): foreach's fused kernels take
    lists of one dtype and device (batch norm's running statistics are float, its batch counts
    int64; a mixed list falls back to one copy per tensor)."""
    groups: dict = {}
    for k, i in pairs:
        groups.setdefault((args[i].dtype, args[i].device, traced[k].dtype), []).append((k, i))
    return tuple(tuple(g) for g in groups.values())


def run_epilogue(meta: GraphMeta, args, traced) -> tuple:
    """Write mutated inputs back, then assemble the outputs the captured graph returns."""
    together, one_by_one = _copy_plan(meta)
    if together:
        groups = meta.__dict__.get("_ember_copy_groups")
        if groups is None:  # dtypes and devices are fixed per variant (guarded): group once
            groups = meta.__dict__["_ember_copy_groups"] = _copy_groups(together, args, traced)
        with torch.no_grad():
            for group in groups:
                torch._foreach_copy_([args[i] for _, i in group], [traced[k] for k, _ in group])
    for k, i in one_by_one:
        if meta.inputs[i].mutation.under_no_grad:
            with torch.no_grad():
                args[i].copy_(traced[k])
        else:
            args[i].copy_(traced[k])
    out = []
    for info in meta.outputs:
        kind = info.kind
        if kind is OutputKind.PLAIN:
            out.append(traced[info.source])
        elif kind is OutputKind.INPUT:
            out.append(args[info.source])
        elif kind is OutputKind.ALIAS_OF_INPUT:
            out.append(_regenerate(args[info.source], info))
        elif kind is OutputKind.ALIAS_OF_INTERMEDIATE:
            base = traced[info.source]
            out.append(base if info.view is None else _regenerate(base, info))
        else:
            out.append(info.value)
    return tuple(out) if meta.output_is_tuple else out[0]


def plain_outputs(meta: GraphMeta):
    """The traced positions of the outputs when the epilogue has nothing to do (no mutated input,
    every output a plain traced one: the common case, a few microseconds per call saved), else None."""
    if meta.mutated or not all(o.kind is OutputKind.PLAIN for o in meta.outputs):
        return None
    return tuple(o.source for o in meta.outputs)


def finish_outputs(meta: GraphMeta, plain, args, traced):
    """The captured graph's outputs: straight from ``traced`` when ``plain``, else the epilogue."""
    if plain is None:
        return run_epilogue(meta, args, traced)
    if meta.output_is_tuple:
        if type(traced) is tuple and len(traced) == len(plain) and plain == _IDENTITY.get(len(plain)):
            return traced  # every traced output, in order (the usual case): no copy of the tuple
        return tuple([traced[k] for k in plain])
    return traced[plain[0]]


# n -> (0, ..., n-1), to recognize outputs (or inputs) taken in order without building a range per call
_IDENTITY = {n: tuple(range(n)) for n in range(256)}


def _all_in_order(positions, n: int) -> bool:
    """``positions`` are 0..n-1 in order: the call's arguments can be passed on as they are."""
    return tuple(positions) == tuple(range(n))


def _regenerate(base: torch.Tensor, info) -> torch.Tensor:
    """The view the captured graph returned, rebuilt on the real base (its autograd edge included)."""
    size, stride, offset = info.view
    if info.requires_grad or not base.requires_grad:
        return base.as_strided(size, stride, offset)
    # the eager output needs no gradient (a view of a detach): a view made under no_grad would
    # still require it (views of a tensor that requires grad do, whatever the grad mode)
    return base.detach().as_strided(size, stride, offset)


class EagerVariant:
    kind = "eager"

    def __init__(self, gm: fx.GraphModule, reason: str, meta: GraphMeta | None = None):
        self.gm, self.reason, self.meta = gm, reason, meta

    def __call__(self, *args):
        return self.gm(*args)

    def describe(self) -> str:
        return f"eager variant: runs the captured graph as is, because {self.reason}"


class InferenceVariant:
    kind = "inference"

    def __init__(self, meta: GraphMeta, graph: fx.GraphModule, compiled: Callable):
        self.meta, self.graph, self.compiled = meta, graph, compiled
        self._tidx = meta.graph_inputs
        self._boxed = bool(getattr(compiled, "_boxed_call", False))
        self._plain = plain_outputs(meta)
        # every argument is a graph input, in order (a graph of tensors only: each part of a
        # regionally compiled model): the call's tuple goes on as it is, no list built per call
        self._all = not self._boxed and _all_in_order(self._tidx, len(meta.inputs))
        self._ident = meta.output_is_tuple and self._plain is not None and _all_in_order(self._plain, len(self._plain))
        self._single = not meta.output_is_tuple and self._plain is not None
        hook = getattr(compiled, "on_decided", None)  # (a graph whose first calls are timed: ember.cudagraphs.measure)
        if hook is not None:
            hook(self._retarget)

    def _retarget(self, target: Callable) -> None:
        """From now on, call ``target`` (called as ``compiled`` was) instead of ``compiled``."""
        self.compiled = target

    def __call__(self, *args):
        # No traced output needs a gradient, but the ATen graph has no grad-mode switches of its own:
        # an op the captured graph ran under no_grad (an @torch.no_grad entry) must not record here.
        inputs = args if self._all else [args[i] for i in self._tidx]
        if _any_autocast():
            with torch._C._DisableAutocast(), torch.no_grad():
                traced = call_compiled(self.compiled, inputs)
        else:
            grad = _grad_enabled()
            if grad:
                _set_grad_enabled(False)
            try:
                traced = self.compiled(inputs) if self._boxed else self.compiled(*inputs)
            finally:
                if grad:
                    _set_grad_enabled(True)
        # finish_outputs' usual cases, without its frame (a part of a regional model returns one tensor)
        if self._single:
            return traced[self._plain[0]]
        if self._ident and type(traced) is tuple and len(traced) == len(self._plain):
            return traced
        return finish_outputs(self.meta, self._plain, args, traced)


class TrainingVariant:
    kind = "training"

    def __init__(self, meta: GraphMeta, joint, forward: fx.GraphModule, backward: fx.GraphModule,
                 compiled_fw: Callable, compiled_bw: Callable):
        self.meta, self.joint, self.forward, self.backward = meta, joint, forward, backward
        self._tidx = meta.graph_inputs
        self.function = _make_function(meta, joint, compiled_fw, compiled_bw)
        # Function.apply's Python layer only unwraps dead functorch wrappers (then calls the C
        # apply); outside functorch transforms the C apply is called directly, one Python frame
        # and one pass over the arguments less per call
        self._c_apply = super(torch.autograd.Function, self.function).apply
        self._plain = plain_outputs(meta)
        self._all = _all_in_order(self._tidx, len(meta.inputs))
        self._ident = meta.output_is_tuple and self._plain is not None and _all_in_order(self._plain, len(self._plain))
        self._single = not meta.output_is_tuple and self._plain is not None

    def __call__(self, *args):
        inputs = args if self._all else [args[i] for i in self._tidx]
        if torch._C._are_functorch_transforms_active():
            traced = self.function.apply(*inputs)
        else:
            traced = self._c_apply(*inputs)
        # finish_outputs' usual cases, without its frame (as InferenceVariant)
        if self._single:
            return traced[self._plain[0]]
        if self._ident and type(traced) is tuple and len(traced) == len(self._plain):
            return traced
        return finish_outputs(self.meta, self._plain, args, traced)


# marks a tensor's slot in ctx.saved_layout (None cannot: a saved value may itself be None, LSTM's)
_SAVED_TENSOR = object()


def _make_function(meta: GraphMeta, joint, compiled_fw: Callable, compiled_bw: Callable):
    """An autograd.Function whose forward/backward are the compiled graphs of one partition."""
    n_fw = joint.num_fw_outputs
    diff = [k for k, rg in enumerate(meta.traced_requires_grad) if rg]
    non_diff = [k for k, rg in enumerate(meta.traced_requires_grad) if not rg]
    grad_positions = joint.grad_inputs
    n_inputs = len(meta.graph_inputs)

    fw_boxed = bool(getattr(compiled_fw, "_boxed_call", False))
    # whether every saved value is a tensor: known at the first call (a compiled forward returns the
    # same kinds of values every time), so later calls skip sorting them per call
    saved_all_tensors: list = []

    class CompiledFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            if _any_autocast():  # (the traced graphs already hold autocast's casts)
                with torch._C._DisableAutocast():
                    outs = call_compiled(compiled_fw, list(inputs))
            else:
                outs = compiled_fw(list(inputs)) if fw_boxed else compiled_fw(*inputs)
            fw_outs, saved = list(outs[:n_fw]), outs[n_fw:]
            if not saved_all_tensors:
                saved_all_tensors.append(all(isinstance(s, torch.Tensor) for s in saved))
            if saved_all_tensors[0]:
                ctx.saved_layout = None
                ctx.save_for_backward(*saved)
            else:  # keep non-tensors (rare: values baked from shapes) beside the tensors autograd checks
                ctx.saved_layout = [_SAVED_TENSOR if isinstance(s, torch.Tensor) else s for s in saved]
                ctx.save_for_backward(*[s for s in saved if isinstance(s, torch.Tensor)])
            for k, o in enumerate(fw_outs):
                # A view returned by a custom Function may not be modified in place later; the eager
                # output it stands for could be, so hand out a non-view alias instead.
                if isinstance(o, torch.Tensor) and o._is_view():
                    fw_outs[k] = o.detach()
            if non_diff:
                ctx.mark_non_differentiable(*[fw_outs[k] for k in non_diff if isinstance(fw_outs[k], torch.Tensor)])
            # Autograd would hand the backward a zero-filled gradient for every output that got none,
            # non-differentiable ones included: one fill kernel per output, e.g. per batch-norm running
            # statistic (160 per ResNet-50 step). Only differentiable outputs need one, made here.
            ctx.set_materialize_grads(False)
            ctx.diff_meta = [(fw_outs[k].shape, fw_outs[k].dtype, fw_outs[k].device) for k in diff]
            return tuple(fw_outs)

        @staticmethod
        def backward(ctx, *grad_outputs):
            if ctx.saved_layout is None:  # every saved value a tensor
                args = list(ctx.saved_tensors)
            else:
                it = iter(ctx.saved_tensors)
                args = [next(it) if s is _SAVED_TENSOR else s for s in ctx.saved_layout]
                del it
            if hasattr(ctx, "maybe_clear_saved_tensors"):
                # drop autograd's own references (unless retain_graph): with a boxed backward, each
                # saved tensor is then freed at its last use inside the graph
                ctx.maybe_clear_saved_tensors()
            for k, (shape, dtype, device) in zip(diff, ctx.diff_meta):
                g = grad_outputs[k]
                args.append(torch.zeros(shape, dtype=dtype, device=device) if g is None else g.contiguous())
            create_graph = torch.is_grad_enabled()
            with torch.no_grad(), _autocast_off():
                grads = call_compiled(compiled_bw, args)
            result = [None] * n_inputs
            for pos, g in zip(grad_positions, grads):
                result[pos] = g
            if create_graph:
                result = _poison(result)
            return tuple(result)

    CompiledFunction.__name__ = CompiledFunction.__qualname__ = "CompiledFunction"
    return CompiledFunction


def _poison(grads: list) -> list:
    """create_graph=True: the gradients are right, but differentiating them again must fail loudly, not
    silently give zero. Route every gradient through a node that raises if the backward reaches it."""
    present = [k for k, g in enumerate(grads) if g is not None]
    if not present:
        return grads
    err = torch._C._functions.DelayedError(DOUBLE_BACKWARD_ERROR, len(present))
    poisoned = err(*[grads[k].detach().requires_grad_(True) for k in present])
    if isinstance(poisoned, torch.Tensor):
        poisoned = (poisoned,)
    for k, g in zip(present, poisoned):
        grads[k] = g
    return grads
