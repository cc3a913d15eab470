"""Trace each distinct repeated block once, and copy its ATen graph into the whole graph (issue 29).

Why: a transformer's forward is a ``ModuleList`` of identical layers, and ``make_fx`` traced every
layer again: the frontend graph's Python code, functionalization, decompositions and (for training)
autograd's backward formulas, per layer. That was most of a deep model's cold compile (a 24-layer
Llama's joint trace took 4.4 s of its 10.9 s first call on CPU). Regional compilation
(``ember/backends/regional.py``) avoids it by compiling each block on its own, but pays Python frames
per block per step and loses fusion across block boundaries. This pass keeps the whole graph: the
result is the same functional ATen graph that tracing every layer gives, with one trace per distinct
block.

How:

* the frontend graph is planned as regional compilation plans it (``plan_regions``: module calls that
  repeat with the same structure), leaving out calls inside a grad-mode or autocast span;
* each distinct block (structure and input layouts) is traced alone, with fake inputs laid out as the
  frontend saw them: its forward graph (inference) or its joint graph (training), by the same
  functions that trace whole graphs (``trace.py``);
* the whole graph is traced with every such call replaced by a placeholder op, ``ember::block_fwd``
  (inputs -> outputs, plus for training the forward values its backward reads), wrapped in an
  ``autograd.Function`` whose backward is ``ember::block_bwd`` (inputs, saved values, contiguous
  output gradients -> input gradients); autograd itself routes the gradients between blocks and the
  glue, summing where a value feeds several blocks (a Llama's rotary tables);
* then ``inline`` replaces each placeholder op with a copy of the block's traced nodes.

A call whose live inputs differ from its block's traced layouts (or a block whose trace returns an
alias of an input, mutates one, or fails) is traced in place as before; a training graph that
writes one of its own inputs (batch norm's running statistics) is not planned at all (its joint
trace takes the analysis-first path, which traces every block). ``config.aot_block_reuse``
(``EMBER_AOT_BLOCK_REUSE=0``) turns the pass off.
"""
from __future__ import annotations

import collections
import itertools
import operator
import threading
import warnings

import torch
import torch.fx as fx
from torch.multiprocessing.reductions import StorageWeakRef

from ember.config import config
from ember.diagnostics import logging as elog

MIN_CALLS = 2  # calls of one block kind for the pass to trace it alone (one call would gain nothing)

# what the pass did, process-wide: "plans" (graphs traced with block placeholders), "templates"
# (blocks traced alone), "copies" (placeholder calls inlined), "in_place" (calls traced in place:
# live inputs other than the template's), "refused" (block kinds not traced alone, and why),
# "input_writes" (training graphs not planned: they write a graph input, see ``_writes_input``)
STATS: collections.Counter = collections.Counter()

# kind -> Template, while a trace that uses them runs (``BlockRun.close`` removes them)
_TEMPLATES: dict = {}
_kinds = itertools.count()
_lock = threading.Lock()


class NotReusable(Exception):
    """This block cannot be traced alone and copied: its calls are traced in place."""


# --------------------------------------------------------------------------- the placeholder ops

@torch.library.custom_op("ember::block_fwd", mutates_args=())
def block_fwd(kind: int, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """A block's forward: its outputs, then the forward values its backward reads. Exists only
    inside a trace (``inline`` replaces it with the block's nodes)."""
    raise RuntimeError("ember::block_fwd is a tracing placeholder; it never runs")


@block_fwd.register_fake
def _block_fwd_fake(kind, inputs):
    t = _TEMPLATES[kind]
    return [torch.empty_strided(shape, stride, dtype=dtype, device=t.device) for shape, stride, dtype in t.fwd_specs]


@torch.library.custom_op("ember::block_bwd", mutates_args=())
def block_bwd(kind: int, inputs: list[torch.Tensor], saved: list[torch.Tensor],
              tangents: list[torch.Tensor]) -> list[torch.Tensor]:
    """A block's backward: the gradients of its inputs at ``Template.grad_pos``."""
    raise RuntimeError("ember::block_bwd is a tracing placeholder; it never runs")


@block_bwd.register_fake
def _block_bwd_fake(kind, inputs, saved, tangents):
    t = _TEMPLATES[kind]
    return [torch.empty_strided(shape, stride, dtype=dtype, device=t.device) for shape, stride, dtype in t.grad_specs]


OPS = (torch.ops.ember.block_fwd.default, torch.ops.ember.block_bwd.default)


class _BlockFn(torch.autograd.Function):
    """A block call in a joint trace: autograd records one node per call, whose backward is traced
    (by ``torch.autograd.grad`` in the joint trace) as one ``block_bwd`` op."""

    @staticmethod
    def forward(ctx, kind, *inputs):
        t = _TEMPLATES[kind]
        res = torch.ops.ember.block_fwd(kind, list(inputs))
        outs, saved = res[:t.num_out], res[t.num_out:]
        ctx.kind = kind
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(*inputs, *saved)
        ctx.mark_non_differentiable(*saved, *(o for o, rg in zip(outs, t.out_requires_grad) if not rg))
        return (*outs, *saved)

    @staticmethod
    def backward(ctx, *grads):
        t = _TEMPLATES[ctx.kind]
        values = ctx.saved_tensors
        inputs, saved = values[:t.num_in], values[t.num_in:]
        tangents = []
        for k in t.diff:
            g = grads[k]
            shape, _, dtype = t.fwd_specs[k]
            # the block was traced with contiguous output gradients (as the joint trace makes them)
            tangents.append(torch.zeros(shape, dtype=dtype, device=t.device) if g is None
                            else g.contiguous())
        res = torch.ops.ember.block_bwd(ctx.kind, list(inputs), list(saved), tangents)
        out = [None] * t.num_in
        for pos, g in zip(t.grad_pos, res):
            out[pos] = g
        return (None, *out)


# ------------------------------------------------------------------------------------- templates

class Template:
    """One block traced alone: its graph, split into the nodes the forward copies and the nodes the
    backward copies, and the layouts of what the placeholder ops return."""

    def __init__(self, kind: int, in_specs: list, owner: fx.GraphModule, num_out: int, out_requires_grad: list,
                 grad_pos: list | None):
        graph = owner.graph
        self.owner = owner  # (holds the tensor constants the traced graph reads with get_attr)
        self.kind = kind
        self.in_specs = in_specs
        self.num_in = len(in_specs)
        self.num_out = num_out
        self.out_requires_grad = out_requires_grad
        self.device = in_specs[0][4]
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        self.primals, tangents = placeholders[:self.num_in], placeholders[self.num_in:]
        out = next(n for n in reversed(graph.nodes) if n.op == "output")
        flat = list(out.args[0]) if isinstance(out.args[0], (tuple, list)) else [out.args[0]]
        outs, grads = flat[:num_out], flat[num_out:]
        self.joint = grad_pos is not None
        self.grad_pos = grad_pos or []
        self.diff = [k for k, rg in enumerate(out_requires_grad) if rg] if self.joint else []
        if len(tangents) != len(self.diff) or len(grads) != len(self.grad_pos):
            raise NotReusable("the traced graph's inputs or outputs are not the block's")
        self.tangents = tangents
        in_storages = {StorageWeakRef(p.meta["val"].untyped_storage()) for p in self.primals}
        for o in outs:
            if not isinstance(o, fx.Node) or o.op == "placeholder" or not isinstance(o.meta.get("val"), torch.Tensor):
                raise NotReusable("an output is an input or no tensor")
            if StorageWeakRef(o.meta["val"].untyped_storage()) in in_storages:
                raise NotReusable("an output is a view of an input")
        # backward nodes: those reading an output gradient, directly or not; the rest is forward
        backward: set = set(tangents)
        for n in graph.nodes:
            if n.op == "call_function" and any(a in backward for a in n.all_input_nodes):
                backward.add(n)
            elif n.op in ("call_module", "call_method"):
                raise NotReusable(f"the traced graph holds a {n.op} node")
        self.constants = [n for n in graph.nodes if n.op == "get_attr"]
        self.fw_nodes = [n for n in graph.nodes if n.op == "call_function" and n not in backward]
        self.bw_nodes = [n for n in graph.nodes if n.op == "call_function" and n in backward]
        fw = set(self.fw_nodes)
        saved = {a for n in self.bw_nodes for a in n.all_input_nodes if a in fw}
        saved |= {g for g in grads if isinstance(g, fx.Node) and g in fw}
        self.saved = [n for n in self.fw_nodes if n in saved]
        self.outs, self.grads = outs, grads
        for n in (*self.saved, *grads):
            if not isinstance(n, fx.Node) or not isinstance(n.meta.get("val"), torch.Tensor):
                raise NotReusable("a saved value or gradient is no tensor")
        self.fwd_specs = [_spec(n.meta["val"])[:3] for n in (*outs, *self.saved)]
        self.grad_specs = [_spec(n.meta["val"])[:3] for n in grads]


def _spec(t: torch.Tensor) -> tuple:
    """What a block's trace depends on in an input (shape, stride, dtype, offset, device, requires_grad);
    the first three describe what a placeholder op returns."""
    return (tuple(t.shape), tuple(t.stride()), t.dtype, t.storage_offset(), t.device, t.requires_grad)


def _trace_template(part: fx.GraphModule, in_specs: list, fake_mode, decompositions: dict, joint: bool) -> Template:
    from ember.aot import trace

    with fake_mode:
        fakes = [torch.empty_strided(shape, stride, dtype=dtype, device=device).requires_grad_(rg)
                 for shape, stride, dtype, _, device, rg in in_specs]
    kind = next(_kinds)
    with warnings.catch_warnings():
        # (the analysis asks the inputs' data pointers, to find inputs sharing memory; these are fakes
        # made apart, and a block that mutates an input is refused below anyway)
        warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
        return _traced(kind, part, in_specs, fakes, fake_mode, decompositions, joint)


def _traced(kind, part, in_specs, fakes, fake_mode, decompositions, joint) -> Template:
    from ember.aot import trace

    if joint:
        guess = trace.guess_plain_outputs(part, fakes)
        if guess is None:
            raise NotReusable("its outputs are not fresh tensors needing gradients")
        got = trace.trace_joint_analyzed(part, fakes, fake_mode, decompositions, guess)
        if got is None:
            raise NotReusable("its joint trace needs the analysis-first path")
        meta, jg = got
        owner, grad_pos = jg.gm, list(jg.grad_inputs)
    else:
        got = trace.trace_forward_analyzed(part, fakes, fake_mode, decompositions)
        if got is None:
            raise NotReusable("its forward trace needs the analysis-first path")
        meta, owner = got
        grad_pos = None
    from ember.aot.analysis import OutputKind

    if meta.mutated or meta.base_reps or meta.graph_inputs != list(range(len(in_specs))) \
            or list(meta.plain) != list(range(len(meta.outputs))) \
            or any(o.kind is not OutputKind.PLAIN or o.source != k for k, o in enumerate(meta.outputs)):
        raise NotReusable("it mutates an input, or an output is an input, a view or a constant")
    return Template(kind, in_specs, owner, meta.num_traced_outputs, list(meta.traced_requires_grad), grad_pos)


# ------------------------------------------------------------------------------------------ plan

class _Call:
    """Stands for one block call in the outlined graph while the whole graph is traced: the block's
    placeholder op where the live inputs are laid out as its template's, else its nodes in place."""

    def __init__(self, region: "_Region", template: Template):
        self.region, self.template = region, template
        self.__name__ = self.__qualname__ = f"ember_block{template.kind}"  # (named in the outlined graph's code)

    def __call__(self, *inputs):
        t = self.template
        if len(inputs) != t.num_in or not all(isinstance(a, torch.Tensor) and _spec(a) == s
                                              for a, s in zip(inputs, t.in_specs)) \
                or (t.joint and not torch.is_grad_enabled()):
            STATS["in_place"] += 1
            return self.region.module()(*inputs)
        if t.joint:
            res = _BlockFn.apply(t.kind, *inputs)
        else:
            res = torch.ops.ember.block_fwd(t.kind, list(inputs))
        return tuple(res[:t.num_out])


class _Region:
    """One call of a repeated block in the frontend graph: its nodes, the values it reads from
    outside (in first-use order, as ``regional.structure`` numbers them) and those read after it."""

    def __init__(self, gm: fx.GraphModule, nodes: list):
        self.gm, self.nodes = gm, nodes
        inside = set(nodes)
        self.inputs = list(dict.fromkeys(a for n in nodes for a in n.all_input_nodes if a not in inside))
        self.outputs = [n for n in nodes if any(u not in inside for u in n.users)]
        self._module = None

    def key(self, shape: str) -> tuple:
        index = {n: i for i, n in enumerate(self.nodes)}
        return (shape, tuple(index[o] for o in self.outputs), tuple(_input_specs(self.inputs)))

    def module(self) -> fx.GraphModule:
        """The block alone: (inputs...) -> (outputs...)."""
        if self._module is None:
            g = fx.Graph()
            env = {}
            for a in self.inputs:
                env[a] = g.placeholder(a.name)
                env[a].meta = dict(a.meta)
            for n in self.nodes:
                env[n] = g.node_copy(n, lambda a: env[a])
            g.output(tuple(env[o] for o in self.outputs))
            self._module = fx.GraphModule(self.gm, g)
        return self._module


class BlockRun:
    """The outlined graph whose repeated blocks stand for their templates, while one trace runs."""

    def __init__(self, runner: fx.GraphModule, kinds: list):
        self.runner, self.kinds = runner, kinds

    def close(self) -> None:
        for k in self.kinds:
            _TEMPLATES.pop(k, None)


def plan(gm: fx.GraphModule, args: list, fake_mode, decompositions: dict, joint: bool) -> BlockRun | None:
    """The runner that traces ``gm`` with its repeated blocks as placeholder ops, or None (off, nothing
    repeats, nothing could be traced alone). The caller traces with ``runner`` in place of ``gm``,
    calls ``inline`` on the traced graph, and ``close()`` at the end."""
    if not config.aot_block_reuse or not all(isinstance(a, torch.Tensor) for a in args):
        return None
    try:
        return _plan(gm, fake_mode, decompositions, joint)
    except Exception as e:  # noqa: BLE001 - a gap here costs the head start only: traced as before
        elog.get_logger("graph_breaks").info(f"ember aot blocks: no plan: {type(e).__name__}: {e}")
        return None


def _plan(gm: fx.GraphModule, fake_mode, decompositions: dict, joint: bool) -> BlockRun | None:
    from ember.backends import regional

    if joint and any(map(_writes_input, gm.graph.nodes)):
        # the joint trace that uses templates (trace_joint_analyzed) stops at a mutated input, and
        # the graph is traced again without them: a training ResNet with some layers in eval mode
        # traced their template, the whole graph, and the whole graph again
        STATS["input_writes"] += 1
        return None
    shapes: dict = {}
    region_of = regional.plan_regions(gm, shapes=shapes)
    # (a joint trace runs the graph with grad mode on, as its call does; a forward trace in the mode it is called in)
    region_of = _outside_state_spans(gm, region_of, grad0=True if joint else torch.is_grad_enabled())
    members: dict = {}
    for n, call in region_of.items():
        members.setdefault(call, []).append(n)
    groups: dict = {}  # key -> [_Region]
    for call, nodes in members.items():
        region = _Region(gm, nodes)
        try:
            groups.setdefault(region.key(shapes[call]), []).append(region)
        except NotReusable:
            continue
    calls: dict = {}  # first node of a region -> _Call
    kinds = []
    for key, regions in groups.items():
        if len(regions) < MIN_CALLS:
            continue
        inputs = set(regions[0].inputs)
        if any(w in inputs for n in regions[0].nodes for w in _written(n)):
            # (its trace would only find the mutation and be refused: a ResNet's training blocks,
            # whose batch norms update running statistics, cost one wasted trace per kind. A write
            # into a value made inside the block, a ResNet's in-place ReLU, is functionalized in the
            # template like any op; one into a view of an input is found by the trace and refused)
            STATS["refused"] += 1
            continue
        try:
            t = _trace_template(regions[0].module(), list(key[2]), fake_mode, decompositions, joint)
        except NotReusable as e:
            STATS["refused"] += 1
            elog.get_logger("graph_breaks").info(f"ember aot blocks: a block traced in place: {e}")
            continue
        _TEMPLATES[t.kind] = t
        kinds.append(t.kind)
        STATS["templates"] += 1
        for r in regions:
            calls[r.nodes[0]] = _Call(r, t)
    if not kinds:
        return None
    STATS["plans"] += 1
    return BlockRun(_outlined(gm, calls), kinds)


def _outlined(gm: fx.GraphModule, calls: dict) -> fx.GraphModule:
    """``gm`` with each region of ``calls`` replaced by one call of its ``_Call``."""
    g = fx.Graph()
    env: dict = {}
    skip: set = set()
    for n in gm.graph.nodes:
        if n in skip:
            continue
        call = calls.get(n)
        if call is None:
            env[n] = g.node_copy(n, lambda a: env[a])
            continue
        r = call.region
        skip.update(r.nodes)
        node = g.call_function(call, tuple(env[a] for a in r.inputs))
        for k, o in enumerate(r.outputs):
            env[o] = g.call_function(operator.getitem, (node, k))
    g._codegen = gm.graph._codegen
    return fx.GraphModule(gm, g)


def _mutates(n: fx.Node) -> bool:
    """Does this frontend node say it writes into a tensor (in-place call, ``out=``, ``inplace=True``,
    batch norm in training mode, item assignment)? Dropout does not count: its draws are fresh
    tensors, copied in order."""
    from ember.aot import trace

    if n.op not in ("call_function", "call_method"):
        return False
    t = n.target
    if t in (torch.nn.functional.batch_norm, torch.batch_norm):
        training = n.args[5] if len(n.args) > 5 else n.kwargs.get("training", False)
        return training is not False
    if t in trace._DROPOUTS:
        return n.kwargs.get("inplace") is True or (len(n.args) > 3 and n.args[3] is True)
    name = t if isinstance(t, str) else getattr(t, "__name__", "")
    return t in trace._MUTATING or (name.endswith("_") and not name.endswith("__")) \
        or n.kwargs.get("inplace") is True or "out" in n.kwargs


# ops that write running statistics: the positions of (running_mean, running_var) in their arguments
_RUNNING_STATS = {torch.nn.functional.batch_norm: (1, 2), torch.batch_norm: (3, 4),
                  torch.nn.functional.instance_norm: (1, 2), torch.instance_norm: (3, 4)}


def _written(n: fx.Node) -> list:
    """The values this frontend node writes into (``_mutates``): running statistics, ``out=``, else
    its first argument."""
    if not _mutates(n):
        return []
    at = _RUNNING_STATS.get(n.target)
    if at is not None:
        written = [n.args[i] if len(n.args) > i else None for i in at]
        written += [n.kwargs.get(k) for k in ("running_mean", "running_var")]
    elif "out" in n.kwargs:
        written = [n.kwargs["out"]]
    else:
        written = [n.args[0] if n.args else None]
    flat = [w for x in written for w in (x if isinstance(x, (tuple, list)) else (x,))]
    return [w for w in flat if isinstance(w, fx.Node)]


def _writes_input(n: fx.Node) -> bool:
    """Does this frontend node write into an input of the graph itself (a buffer's ``add_``, batch norm's
    running statistics in training mode)? Writes into views of inputs are not seen here (their
    graphs are traced twice, as before)."""
    return any(w.op == "placeholder" for w in _written(n))


def _input_specs(inputs: list) -> list:
    specs, storages = [], set()
    for p in inputs:
        v = p.meta.get("example_value", p.meta.get("val"))
        if not isinstance(v, torch.Tensor) or v.layout != torch.strided or v.is_sparse:
            raise NotReusable("an input is no strided tensor")
        if any(not isinstance(s, int) for s in (*v.shape, *v.stride())) or v.storage_offset() != 0:
            raise NotReusable("an input has symbolic sizes or a storage offset")
        ref = StorageWeakRef(v.untyped_storage())
        if ref in storages:
            raise NotReusable("two inputs share storage")
        storages.add(ref)
        specs.append(_spec(v))
    if not specs:
        raise NotReusable("no inputs")
    return specs


def _outside_state_spans(gm: fx.GraphModule, region_of: dict, grad0: bool) -> dict:
    """``region_of`` without the calls that run under a grad mode or autocast other than the
    graph's start (a block traced alone starts in the caller's state)."""
    from ember.backends.regional import _STATE_CHANGES

    grad = grad0
    depth = 0
    bad = set()
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target in _STATE_CHANGES:
            if n.target is torch._C._set_grad_enabled:
                grad = n.args[0] if n.args and type(n.args[0]) is bool else not grad0
            elif n.target is torch.amp.autocast_mode._enter_autocast:
                depth += 1
            else:
                depth -= 1
            if n in region_of:
                bad.add(region_of[n])
        if (grad != grad0 or depth != 0) and n in region_of:
            bad.add(region_of[n])
    return {n: c for n, c in region_of.items() if c not in bad}


# ---------------------------------------------------------------------------------------- inline

def inline(gm: fx.GraphModule) -> int:
    """Replace every placeholder op of ``gm``'s graph with a copy of its block's nodes; the number
    of calls replaced."""
    g = gm.graph
    copied = 0
    fwd_op, bwd_op = OPS
    constants: dict = {}  # (kind, template get_attr node) -> its node in gm: one attribute per constant
    for n in list(g.nodes):
        if n.op != "call_function" or n.target not in OPS:
            continue
        t = _TEMPLATES[n.args[0]]
        for c in t.constants:
            if (t.kind, c) not in constants:
                name = f"_ember_block{t.kind}_{c.target}"
                setattr(gm, name, getattr(t.owner, c.target))
                with g.inserting_before(next(iter(g.nodes))):
                    constants[t.kind, c] = g.create_node("get_attr", name)  # (as make_fx stores constants)
                constants[t.kind, c].meta = dict(c.meta)
        if n.target is fwd_op:
            env = {c: constants[t.kind, c] for c in t.constants}
            env.update(zip(t.primals, n.args[1]))
            nodes, results = t.fw_nodes, (*t.outs, *t.saved)
        else:
            env = {c: constants[t.kind, c] for c in t.constants}
            env.update(zip(t.primals, n.args[1]))
            env.update(zip(t.saved, n.args[2]))
            env.update(zip(t.tangents, n.args[3]))
            nodes, results = t.bw_nodes, t.grads
        with g.inserting_before(n):
            for tn in nodes:
                if tn not in env:
                    env[tn] = g.node_copy(tn, lambda a: env[a])
        for user in list(n.users):
            if user.op != "call_function" or user.target is not operator.getitem:
                raise RuntimeError(f"ember aot blocks: {n.name} is read by {user.format_node()}")
            user.replace_all_uses_with(env[results[user.args[1]]])
            g.erase_node(user)
        g.erase_node(n)
        copied += 1
    STATS["copies"] += copied
    return copied
