"""Trace a captured Torch-level graph to functional ATen graphs with ``make_fx``: the forward alone (for
inference) or the forward together with its backward (the joint graph, for training).

Both traces run the captured graph on functional wrappers of fake inputs (see ``functional.py``) and
return the traced outputs described in ``analysis.py``. The joint trace then calls
``torch.autograd.grad`` on the differentiable ones, so autograd's own backward formulas are recorded
(decomposed by the same table) after the forward. Placeholders are named ``primals_<k>`` and
``tangents_<k>``; tensor inputs and ints traced as symbols become placeholders, other values are baked in.
"""
from __future__ import annotations

import collections
import contextlib
import operator
from dataclasses import dataclass

import torch
import torch.fx as fx
from torch.fx._lazy_graph_module import _use_lazy_graph_module

from ember.aot.analysis import GraphMeta, base_of, fake_input, is_symint, meta_of, symbolic_dispatch
from ember.aot.functional import from_fun, functionalize, to_fun, to_fun_leaf
from ember.aot.lazy_code import as_text_code
from ember.aot.lazy_table import make_fx_lazy
from ember.aot.ops import TraceRewrites
from ember.config import config


@dataclass
class JointGraph:
    gm: fx.GraphModule                 # (primals..., tangents...) -> (traced outputs..., grads...)
    num_fw_outputs: int
    grad_inputs: list[int]             # positions among tensor inputs that receive a gradient output
    primal_vals: list                  # fake primals, for compilers that want example inputs


@contextlib.contextmanager
def _trace_state(grad_enabled: bool):
    """Tracing runs the captured graph's own grad-mode switches; restore the caller's grad mode
    afterwards even if tracing fails. (Autocast's cast cache stays on, as in eager: a weight cast once
    and used twice gets one cast node, whose backward sums both gradients in low precision, as
    eager's does.)"""
    with torch.set_grad_enabled(grad_enabled):
        yield


def _user_body(gm, meta: GraphMeta, consts: list, clone_mutated: bool):
    """The captured graph as a function of its tensor inputs, returning the traced outputs."""
    tensor_idx = meta.graph_inputs

    def body(tensors):
        args = list(consts)
        for i, t in zip(tensor_idx, tensors):
            args[i] = t
        if clone_mutated:
            # In the joint, primals are leaves; mutating a clone keeps autograd happy, and it makes the
            # primal an input of the clone only, so the partitioner never has to save a tensor that the
            # runtime later overwrites (which autograd's version check would reject).
            for i in meta.mutated:
                args[i] = args[i].clone()
        with TraceRewrites():
            outs = gm(*args)
        if not isinstance(outs, (tuple, list)):
            outs = (outs,)
        return ([args[i] for i in meta.mutated] + [outs[j] for j in meta.plain]
                + [base_of(outs[j]) for j in meta.base_reps])

    return body


def _trace(fn, decompositions: dict, *args) -> fx.GraphModule:
    """``make_fx(fn)(*args)`` as a lazy graph module (``torch.fx._lazy_graph_module``): its Python code
    is generated when first read or run, not at every ``recompile()``. Of the graphs traced here, the
    caches read the code of those they store, the native backend runs it only as its fallback, and
    each ``recompile()`` of a 24-layer Llama's joint graph (the code of ~12,000 nodes, then
    ``compile()``) took ~0.3 s; a training step's graphs were recompiled 8 times. ember's tables are
    asked op by op, not copied (``make_fx_lazy``)."""
    with _use_lazy_graph_module(True):
        return make_fx_lazy(fn, decompositions)(*args)


def _finish(gm: fx.GraphModule, name: str) -> fx.GraphModule:
    """Flat calling convention: positional tensors in, one tuple out (no pytree codegen)."""
    gm.graph._codegen = fx.graph.CodeGen()
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    flat = out.args[0]
    out.args = (tuple(flat) if isinstance(flat, (list, tuple)) else (flat,),)
    gm.graph.eliminate_dead_code()
    gm.recompile()  # (lazy: the code is generated when read)
    gm = as_text_code(gm)  # (read as text by the caches; compiled only if the graph runs)
    gm._ember_name = name
    return gm


def _fake_primals(args, meta: GraphMeta, fake_mode, templates=None) -> list:
    prims = []
    for i in meta.graph_inputs:
        a = args[i]
        if not isinstance(a, torch.Tensor):
            prims.append(templates[i])  # an int traced as a symbol: the graph takes the SymInt
            continue
        # leaves, so autograd.grad can be taken with respect to them
        f = fake_input(a.detach(), fake_mode, templates[i] if templates else None)
        prims.append(f.requires_grad_(a.requires_grad) if a.requires_grad else f)
    return prims


def trace_forward(gm, meta: GraphMeta, args: list, fake_mode, decompositions: dict,
                  templates: list | None = None) -> fx.GraphModule:
    """Inference graph: (tensor inputs...) -> (traced outputs...), functional ATen."""
    body = _user_body(gm, meta, args, clone_mutated=False)

    def forward(primals):
        with functionalize():
            outs = body([to_fun(p) for p in primals])
            return [from_fun(o) for o in outs]

    with _trace_state(meta.grad_enabled), fake_mode, symbolic_dispatch(templates):
        prims = _fake_primals(args, meta, fake_mode, templates)
        traced = _trace(forward, decompositions, prims)
    return _finish(traced, "forward")


class NotPlainInference(Exception):
    """``trace_forward_analyzed`` found what the analysis-first path must handle."""


def trace_forward_analyzed(gm, args: list, fake_mode, decompositions: dict, templates: list | None = None,
                           functional: bool | None = None, runner=None):
    """``analysis.collect`` and ``trace_forward`` in one functionalized run: the metadata is read
    inside the trace, from the same wrappers, and decides what the traced function returns, so the
    graph is the one ``trace_forward(collect(...))`` gives without running the captured graph a
    second time (a 24-layer Llama's analysis run took ~0.5 s of its ~3.5 s cold compile on CPU).
    Returns (meta, graph), or None where the graph needs the analysis-first path: an output needs a
    gradient (a joint trace), or the metadata says it must run eagerly (``meta.unsupported``).
    ``functional``: as for ``trace_joint_analyzed`` (a graph showing no mutation is traced without
    the functionalization layer and kept where it records no mutating op). ``runner``: what runs in
    place of ``gm`` (``blocks.plan``'s split graph, whose repeated blocks are placeholder ops that
    are inlined after the trace)."""
    if functional is None:
        functional = not (config.aot_joint_unfunctionalized and templates is None and may_skip_functionalization(gm))
    run = gm if runner is None else runner
    grad_enabled = torch.is_grad_enabled()
    found: list = []
    wrap, unwrap, context = (to_fun, from_fun, functionalize) if functional else (_same, _same, contextlib.nullcontext)

    def forward(primals):
        with context():
            f_prims = [wrap(p) for p in primals]
            f_args = list(args)
            for i, t in zip(tensor_pos, f_prims):
                f_args[i] = t
            with TraceRewrites():
                outs = run(*f_args)
            meta = meta_of(fakes, f_args, outs, args, grad_enabled, gm)
            found.append(meta)
            if meta.unsupported is not None or any(meta.traced_requires_grad):
                raise NotPlainInference
            flat = list(outs) if isinstance(outs, (tuple, list)) else [outs]
            traced = ([f_args[i] for i in meta.mutated] + [flat[j] for j in meta.plain]
                      + [base_of(flat[j]) for j in meta.base_reps])
            return [unwrap(o) for o in traced]

    with _trace_state(grad_enabled), fake_mode, symbolic_dispatch(templates):
        # the inputs trace_forward traces with (detached fakes, as _fake_primals makes them)
        fakes = list(args)
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                f = fake_input(a.detach(), fake_mode, templates[i] if templates else None)
                fakes[i] = f.requires_grad_(a.requires_grad) if a.requires_grad else f
            elif templates and is_symint(templates[i]):
                fakes[i] = templates[i]
        tensor_pos = [i for i, a in enumerate(fakes) if isinstance(a, torch.Tensor) or is_symint(a)]
        try:
            traced = _inlined(_trace(forward, decompositions, [fakes[i] for i in tensor_pos]), runner)
        except NotPlainInference:
            traced = None
        except Exception:  # noqa: BLE001 - unfunctionalized: what the functionalized trace meets and reports
            if functional:
                raise
            traced = None
    if not functional and traced is None and found and found[-1].unsupported is None \
            and any(found[-1].traced_requires_grad):
        return None  # (an output needs a gradient: the joint path, whatever functionalization would say)
    if not functional and (traced is None or found[-1].mutated or not all(map(_functional_node, traced.graph.nodes))):
        FORWARD_UNFUNCTIONALIZED["misses"] += 1  # the functionalized trace decides
        return trace_forward_analyzed(gm, args, fake_mode, decompositions, templates, functional=True, runner=runner)
    if traced is None:
        return None
    meta = found[-1]
    if meta.graph_inputs != tensor_pos:  # (the traced graph takes exactly the inputs the variant passes)
        return None
    if not functional:
        FORWARD_UNFUNCTIONALIZED["hits"] += 1
    return meta, _finish(traced, "forward")


FORWARD_UNFUNCTIONALIZED: collections.Counter = collections.Counter()  # (as JOINT_ANALYZED, for inference traces)


def trace_joint(gm, meta: GraphMeta, args: list, fake_mode, decompositions: dict,
                templates: list | None = None) -> JointGraph:
    """Joint graph: (primals..., tangents...) -> (traced outputs..., grads of inputs needing them...)."""
    body = _user_body(gm, meta, args, clone_mutated=True)
    diff = [k for k, rg in enumerate(meta.traced_requires_grad) if rg]
    grad_pos: list[int] = []

    def joint(primals, tangents):
        with functionalize():
            f_prims = [to_fun_leaf(p) if isinstance(p, torch.Tensor) else p for p in primals]
            outs = body(f_prims)
            wrt = [k for k, p in enumerate(f_prims) if isinstance(p, torch.Tensor) and p.requires_grad]
            # An autocast region around the compiled call covers its forward only: eager's backward
            # runs later, outside it (the runtime likewise runs the backward graph with autocast off).
            with torch._C._DisableAutocast():
                grads = torch.autograd.grad([outs[k] for k in diff], [f_prims[k] for k in wrt],
                                            [to_fun(t) for t in tangents], allow_unused=True)
            # inputs the outputs do not depend on get no gradient at all (None, as in eager), so they
            # are not graph outputs
            grad_pos[:] = [k for k, g in zip(wrt, grads) if g is not None]
            return [from_fun(o) for o in outs] + [from_fun(g) for g in grads if g is not None]

    with _trace_state(True), fake_mode, symbolic_dispatch(templates):
        prims = _fake_primals(args, meta, fake_mode, templates)
        # contiguous tangents shaped like the differentiable outputs; the runtime makes incoming
        # gradients contiguous to match
        tangents = [torch.empty(shape, dtype=dtype, device=device)
                    for shape, dtype, device in (meta.traced_specs[k] for k in diff)]
        traced = _trace(joint, decompositions, prims, tangents)
    joint_gm = _finish(traced, "joint")
    mutated_tensor_pos = {meta.graph_inputs.index(i) for i in meta.mutated}
    for k, node in enumerate(n for n in joint_gm.graph.nodes if n.op == "placeholder" and n.name.startswith("primals")):
        # read by the partitioner: the runtime overwrites mutated inputs, so they must not be saved
        node.meta["ember_mutated_input"] = k in mutated_tensor_pos
    return JointGraph(joint_gm, meta.num_traced_outputs, grad_pos, prims)



# how often trace_joint_analyzed's guess held ("hits": no analysis run) or not ("misses": the analysis
# and trace_joint ran after it), for probes and tests
JOINT_ANALYZED: collections.Counter = collections.Counter()


class NotAsGuessed(Exception):
    """``trace_joint_analyzed`` found metadata other than it guessed: the analysis-first path traces."""


def guess_plain_outputs(gm: fx.GraphModule, args: list):
    """(requires_grad, (shape, dtype, device)) per tensor output, as ``analysis.collect`` would give
    them for a graph that mutates none of its inputs and returns fresh tensors only, read from the
    frontend's example values of the outputs; None where they are missing or say otherwise (an
    output that is an input, a non-tensor node, symbolic sizes)."""
    out = next((n for n in reversed(gm.graph.nodes) if n.op == "output"), None)
    if out is None or not all(isinstance(a, torch.Tensor) for a in args):
        return None
    flat = out.args[0] if isinstance(out.args[0], (tuple, list)) else (out.args[0],)
    rgs, specs = [], []
    for value in flat:
        if not isinstance(value, fx.Node):
            if isinstance(value, (torch.Tensor, fx.Node, tuple, list, dict)):
                return None
            continue  # a constant output
        if value.op == "placeholder":
            return None
        ex = value.meta.get("example_value")
        if not isinstance(ex, torch.Tensor):
            return None
        shape = tuple(ex.shape)
        if not all(type(d) is int for d in shape):
            return None
        rgs.append(bool(ex.requires_grad))
        specs.append((shape, ex.dtype, ex.device))
    return (rgs, specs) if any(rgs) else None


def trace_joint_analyzed(gm, args: list, fake_mode, decompositions: dict, guess, functional: bool | None = None,
                         runner=None):
    """``analysis.collect`` and ``trace_joint`` in one functionalized run, for the usual training graph
    (no input mutated, every output a fresh tensor). The tangents are inputs of the joint graph, so
    their shapes must be known before tracing: ``guess`` (``guess_plain_outputs``) gives them from
    the frontend's example values. The metadata is read inside the trace, from the same wrappers,
    before the backward is traced; where it is not what was guessed (a mutation, an aliased output,
    another shape or requires_grad), the trace stops there and None sends the caller to the
    analysis-first path. Otherwise the graph is the one ``trace_joint(collect(...))`` gives, without
    running the captured graph a second time (a 24-layer Llama's analysis run took ~0.6 s of its
    ~8 s cold training compile on CPU). Returns (meta, JointGraph) or None.

    ``functional`` False (None: ``config.aot_joint_unfunctionalized`` and ``may_skip_functionalization``
    decide): traced without the functionalization layer, which rewrites mutations only and cost
    ~27% of a 24-layer Llama's joint trace. The graph is kept only if it is functional anyway (every
    node an ATen op whose schema mutates nothing; checked on the forward before the backward is
    traced, then on the whole graph): then it is the graph the functionalized trace records. Else the
    functionalized trace runs. ``runner``: as for ``trace_forward_analyzed``."""
    if functional is None:
        functional = not (config.aot_joint_unfunctionalized and may_skip_functionalization(gm))
    run = gm if runner is None else runner
    rgs, specs = guess
    diff = [k for k, rg in enumerate(rgs) if rg]
    found: list = []
    grad_pos: list[int] = []
    if functional:
        wrap, wrap_leaf, unwrap, context = to_fun, to_fun_leaf, from_fun, functionalize
    else:
        wrap = wrap_leaf = unwrap = _same
        context = contextlib.nullcontext

    def joint(primals, tangents):
        with context():
            f_prims = [wrap_leaf(p) for p in primals]
            with TraceRewrites():
                outs = run(*f_prims)
            meta = meta_of(fakes, f_prims, outs, args, True, gm)
            found.append(meta)
            if (meta.unsupported is not None or meta.mutated or meta.base_reps
                    or meta.traced_requires_grad != rgs or meta.traced_specs != specs):
                raise NotAsGuessed
            if not functional and not _functional_so_far():
                raise NotAsGuessed  # (the forward mutated something: before the backward is traced)
            flat = list(outs) if isinstance(outs, (tuple, list)) else [outs]
            traced = [flat[j] for j in meta.plain]
            wrt = [k for k, p in enumerate(f_prims) if p.requires_grad]
            with torch._C._DisableAutocast():  # (as trace_joint: eager's backward runs outside autocast)
                grads = torch.autograd.grad([traced[k] for k in diff], [f_prims[k] for k in wrt],
                                            [wrap(t) for t in tangents], allow_unused=True)
            grad_pos[:] = [k for k, g in zip(wrt, grads) if g is not None]
            return [unwrap(o) for o in traced] + [unwrap(g) for g in grads if g is not None]

    with _trace_state(True), fake_mode:
        fakes = [fake_input(a.detach(), fake_mode) for a in args]
        fakes = [f.requires_grad_(a.requires_grad) if a.requires_grad else f for f, a in zip(fakes, args)]
        tangents = [torch.empty(specs[k][0], dtype=specs[k][1], device=specs[k][2]) for k in diff]
        try:
            traced = _inlined(_trace(joint, decompositions, fakes, tangents), runner)
        except Exception:  # noqa: BLE001 - NotAsGuessed, or what the analysis-first path will meet and report
            traced = None
    if traced is not None and not functional and not all(map(_functional_node, traced.graph.nodes)):
        traced = None  # (the backward mutated something)
    if traced is None or found[-1].graph_inputs != list(range(len(args))):
        JOINT_ANALYZED["misses" if functional else "unfunctionalized misses"] += 1
        if not functional:  # the functionalized trace of the same guess
            return trace_joint_analyzed(gm, args, fake_mode, decompositions, guess, functional=True, runner=runner)
        return None
    meta = found[-1]
    JOINT_ANALYZED["hits" if functional else "unfunctionalized hits"] += 1
    joint_gm = _finish(traced, "joint")
    for node in joint_gm.graph.nodes:
        if node.op == "placeholder" and node.name.startswith("primals"):
            node.meta["ember_mutated_input"] = False  # (read by the partitioner; nothing is mutated)
    return meta, JointGraph(joint_gm, meta.num_traced_outputs, grad_pos, fakes)


def _same(value):
    return value


def _inlined(traced: fx.GraphModule, runner) -> fx.GraphModule:
    """``traced`` with the block placeholder ops of ``runner`` (``blocks.plan``) replaced by copies of
    their blocks' nodes."""
    if runner is not None:
        from ember.aot import blocks
        blocks.inline(traced)
    return traced


def _functional_node(node) -> bool:
    """A node a functionalized trace would record as it is: an input, an output, a tuple element, or
    an ATen/prims op whose schema mutates no argument (effectful ops, other namespaces and
    higher-order ops are not trusted)."""
    if node.op != "call_function":
        return node.op in ("placeholder", "output", "get_attr")
    t = node.target
    if t is operator.getitem:
        return True
    if isinstance(t, torch._ops.OpOverload) and t.namespace == "ember" and t._opname in ("block_fwd", "block_bwd"):
        return True  # (a block's placeholder op, ember/aot/blocks.py: its block was traced functional)
    if not isinstance(t, torch._ops.OpOverload) or t.namespace not in ("aten", "prims"):
        return False
    if t._schema.is_mutable:
        return False
    from torch._higher_order_ops.effects import has_effects
    return not has_effects(t)  # (functionalization threads effect tokens through these)


def _functional_so_far() -> bool:
    """Are the nodes the running make_fx trace has recorded so far all functional?"""
    mode = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.PROXY)
    tracer = getattr(mode, "tracer", None)
    return tracer is not None and all(map(_functional_node, tracer.graph.nodes))


# torch-level callables whose calls mutate their inputs (in-place methods and functions end in "_"
# and are caught by name), or whose ATen decompositions fill a fresh tensor in place (dropout's
# bernoulli_); a graph calling one is traced functionalized from the start
_F = torch.nn.functional
_MUTATING = {_F.batch_norm, torch.batch_norm, _F.instance_norm, torch.instance_norm, operator.setitem,
             operator.iadd, operator.isub, operator.imul, operator.itruediv, torch.bernoulli}
# dropouts: (input, p, training, ...) in every spelling; one with training=False or p=0 is the identity
_DROPOUTS = {_F.dropout, _F.dropout1d, _F.dropout2d, _F.dropout3d, _F.alpha_dropout, _F.feature_alpha_dropout,
             torch.dropout}


def _dropout_draws(n) -> bool:
    p = n.args[1] if len(n.args) > 1 else n.kwargs.get("p", 0.5)
    training = n.args[2] if len(n.args) > 2 else n.kwargs.get("training", n.kwargs.get("train", True))
    return not (training is False or (type(p) in (int, float) and p == 0))


def may_skip_functionalization(gm: fx.GraphModule) -> bool:
    """Does nothing in the captured graph say it mutates (in-place calls, ``inplace=True``, ``out=``,
    batch norm's running statistics, item assignment)? Only a guess: the traced graph is checked."""
    for n in gm.graph.nodes:
        if n.op not in ("call_function", "call_method"):
            continue
        t = n.target
        name = t if isinstance(t, str) else getattr(t, "__name__", "")
        if t in _MUTATING or (name.endswith("_") and not name.endswith("__")):
            return False
        if t in _DROPOUTS and _dropout_draws(n):
            return False
        if n.kwargs.get("inplace") is True or "out" in n.kwargs:
            return False
    return True
