"""Regional compilation: compile each distinct repeated block of a graph once, and share it.

Why: a transformer is a ``ModuleList`` of identical layers, and the frontend inlines every
``self.layers[i](x)`` into one graph, so the backend (ATen tracing, partitioning, code generation)
would do the same work once per layer. Here the backend's work scales with the number of *distinct*
blocks instead: a 24-layer model compiles its layer once, as a 12-layer one does.

How (graph-level regional compilation, a pass in front of a registered backend):

* the frontend marks the nodes each ``nn.Module`` call added (``node.meta["ember_module_calls"]``,
  outermost call first; ``frontend/variables/modules.py``);
* a module call is a *region* when another call of the graph has the same structure (ops, constants,
  input descriptions; parameters are graph inputs already, so weights are inputs of the region) and
  it has at least ``MIN_REGION_OPS`` ops; each node goes to its outermost region;
* the graph is split there (``torch.fx`` ``split_module``, as the DDP pass splits at buckets): the
  regions and the glue between them become parts, called in order by the split GraphModule;
* a part is compiled at its first call, with that call's real inputs, under a key (``part_key``) of its
  structure, the description of every input (type, sizes, strides, offset, dtype, device,
  requires_grad, leaf/view status, which inputs share storage), the global state that tracing reads,
  and the backend with its mode; a part whose key was compiled before, in this graph or any other
  (``ember.compile(layer)`` on each layer), reuses that compiled callable: one trace, one forward and
  backward graph, one set of kernels for every identical layer. A layer that differs (shapes, a
  dropout probability, an int attribute, other submodules) has another key and its own compile.

Each part runs as its own autograd node, exactly as the whole graph would (each compiled part is
the backend's autograd-aware callable). Once compiled, a part leaves the call path: the split
GraphModule's attribute becomes the compiled callable itself (``RegionalPart``), so per part and call
only that callable's frames run (the autograd layer's dispatch and variant, the native wrapper). What
is lost against whole-graph compilation is what crosses a block boundary: fusion (a pre-norm block's
last residual add with the next block's LayerNorm) and common subexpressions (a boolean attention
mask converted to an additive one in each block instead of once); ``tests/regional/test_parity.py``
counts the kernels per step. Only ember's own backends that keep no per-graph state take part
(``SHAREABLE``); CUDA-graph modes and user callables are left alone. Under DistributedDataParallel
a graph of repeated blocks is split here instead of at DDP's buckets (``split_for_ddp``, any block
size, ``config.regional_ddp``); one without them still goes to the bucket split.
When it is on: ``ember.config.regional_compile = True`` (``EMBER_REGIONAL_COMPILE=1``) or
``ember.compile(..., options={"regional": True})`` for every graph; otherwise automatically for a
training graph whose repeated block holds at least ``config.regional_auto_block_params`` parameter
elements (16M: a 1B Llama's layer, not GPT-2's or BERT's) and is called ``AUTO_MIN_CALLS`` times or
more (``AUTO_INFERENCE`` says why inference graphs are left whole).
There a block's kernels take far longer than the Python frames it adds per call (small models,
where they don't, stay whole: BERT's steps were slower on an H100, regional-gpu-h100.json), and the
compile of a deep model costs about that of one layer. Off: ``options={"regional": False}`` (one
compile) or ``regional_auto_block_params = 0`` (``EMBER_REGIONAL_AUTO_BLOCK_PARAMS=0``).
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import threading
import weakref

import torch
import torch.fx as fx

from ember.config import config
from ember.diagnostics import logging as elog
from ember.distributed.buckets import CompiledPart

PASS_NAME = "regional"
MIN_REGION_OPS = 4  # a smaller repeated call (one Linear) is cheaper to fuse with its neighbours than to share
# the automatic choice (config.regional_auto_block_params): a block must repeat this often, as a
# model's layers do; fewer calls save little compile time against the fusion lost at each boundary
AUTO_MIN_CALLS = 8
# ... and the graph must be a training one: its step runs each block forward and backward (about 3x
# the forward's device time) while the host pays the block's frames about twice, so they hide behind
# the kernels. An inference step of a 1B Llama on an H100 is near host-bound even whole (estimated
# ~0.15 ms of kernels per layer at 512 tokens, against ~0.18 ms of host work per GPT-2 layer whole
# measured in regional-gpu-h100.json): more frames per block would show, so inference stays whole
AUTO_INFERENCE = False
SHAREABLE = {"ember": {None, "default", "max-autotune-no-cudagraphs"}, "eager": {None}, "aot_eager": {None}}
_PLAIN = (type(None), bool, int, float, complex, str, torch.dtype, torch.device, torch.layout, torch.memory_format)
_TRUSTED_MODULES = ("torch", "_operator", "operator", "builtins", "math")
# graph nodes that change global state for the nodes after them (grad mode, autocast): a part
# boundary between the change and its users would lose it (each part's backend traces under the
# state it starts in), so a graph holding one is compiled whole
_STATE_CHANGES = (torch._C._set_grad_enabled, torch.amp.autocast_mode._enter_autocast,
                  torch.amp.autocast_mode._exit_autocast)

# key -> compiled callable, shared by every graph of the process (a key describes everything the
# compiled callable depends on, settings included); ember.reset() clears it
_SHARED: dict = {}
# id(compiled) -> (compiled, what capturing it would face: auto.part_facts), for split_replay
_CAPTURE: dict = {}
_lock = threading.Lock()
# what the pass did, process-wide: "compiles" (parts and graphs the backend compiled under a key),
# "reuses" (those that took a callable compiled before), "splits" (graphs split into parts). Kept
# apart from diagnostics.counters, whose events are failures and fallbacks.
STATS: collections.Counter = collections.Counter()


def _bump(name: str) -> None:
    with _lock:
        STATS[name] += 1


def stats() -> collections.Counter:
    """A copy of ``STATS``; ``stats() - before`` is what happened since ``before``."""
    with _lock:
        return collections.Counter(STATS)


class NotShareable(Exception):
    """Something the key cannot describe: the graph or part is compiled on its own."""


def compiler_key(backend_name: str, mode, options) -> tuple | None:
    """What identifies a compiler for sharing, or None when its compiled callables must not be shared."""
    if backend_name not in SHAREABLE or mode not in SHAREABLE[backend_name] or options:
        return None
    return (backend_name, mode)


def with_regions(compiler, key: tuple | None, enabled: bool | None):
    """``compiler`` with the regional pass in front (``enabled``: the compile's option; None: the config)."""
    if key is None or enabled is False:
        return compiler

    @functools.wraps(compiler)
    def backend(gm, example_inputs):
        if _in_ddp():
            return compiler(gm, example_inputs)
        if config.regional_compile if enabled is None else enabled:
            split = split_regions(gm, example_inputs, compiler, key)
            if split is not None:
                return _replayed_whole(split, example_inputs, key)
            return shared_compile(gm, list(example_inputs), compiler, key)  # ember.compile(layer) per layer
        # the automatic choice: large blocks only, and not under torch.distributed (FSDP's sharded
        # parameters and per-layer collectives were measured whole-graph only; on: the option)
        if enabled is None and config.regional_auto_block_params and not _distributed() \
                and (AUTO_INFERENCE or _training(example_inputs)):
            split = split_regions(gm, example_inputs, compiler, key, min_params=config.regional_auto_block_params)
            if split is not None:
                elog.artifact("graph_code", f"{PASS_NAME}: on automatically (repeated blocks of >= "
                                            f"{config.regional_auto_block_params} parameter elements)")
                return _replayed_whole(split, example_inputs, key)
        return compiler(gm, example_inputs)

    for attr in ("ember_backend_name", "prewarm", "prewarm_trace"):
        if hasattr(compiler, attr):
            setattr(backend, attr, getattr(compiler, attr))
    if enabled is not False:  # the DDP pass asks first (ember/distributed/buckets.py: with_ddp_buckets)
        backend.ember_ddp_regions = functools.partial(split_for_ddp, compiler=compiler, key=key)
    return backend


def _replayed_whole(split: fx.GraphModule, example_inputs, key: tuple):
    """An inference split graph of parts that can all be captured replays as one CUDA graph, as the
    whole graph would (``ember/cudagraphs/split_replay.py``); anything else runs part by part."""
    from ember.cudagraphs import split_replay
    return split_replay.wrap(split, example_inputs, key)


def split_for_ddp(gm: fx.GraphModule, example_inputs, compiler, key: tuple):
    """Under DistributedDataParallel: the graph split at its repeated blocks (any size, two calls or
    more), each block compiled once and shared, or None (``config.regional_ddp`` off, nothing repeats).

    Why here and not only for large blocks: DDP needs the graph in parts anyway (one autograd node
    per part, so a bucket's all-reduce starts while the earlier parts' backward runs), and blocks
    are such parts: each block's backward ends on its own, its parameters' gradients are ready then
    and DDP's hooks launch their buckets, as the bucket split would. Splitting by blocks instead of
    by buckets costs no more Python frames per step (a 24-layer Llama: 50 bucket parts before, ~26
    parts now) and compiles one layer instead of every layer."""
    if not config.regional_ddp:
        return None
    split = split_regions(gm, example_inputs, compiler, key)
    if split is not None:
        elog.artifact("graph_code", f"{PASS_NAME}: under DistributedDataParallel, split at the repeated blocks "
                                    "(each block's backward is its own autograd node: DDP's buckets fire as it ends)")
    return split


def _training(example_inputs) -> bool:
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs)


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _in_ddp() -> bool:
    ddp_cls = getattr(torch.nn.parallel, "DistributedDataParallel", None)
    return getattr(ddp_cls, "_active_ddp_module", None) is not None


# ------------------------------------------------------------------------------------- structure

def _target_name(target) -> str:
    if isinstance(target, str):  # call_method
        return target
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return str(target)
    mod = getattr(target, "__module__", None) or ""
    if mod.split(".")[0] not in _TRUSTED_MODULES:
        raise NotShareable(f"the graph calls {mod}.{getattr(target, '__qualname__', target)}")
    return f"{mod}.{getattr(target, '__qualname__', getattr(target, '__name__', repr(target)))}"


def _arg(a, index: dict, fresh: list) -> str:
    """``a`` spelled with values named by position; inputs from outside first seen here go to ``fresh``."""
    if isinstance(a, fx.Node):
        if a in index:
            return f"%{index[a]}"
        key = ("ext", a)
        if key not in index:
            index[key] = len(index)
            fresh.append((index[key], a))
        return f"$in{index[key]}"
    if isinstance(a, (tuple, list)):
        return f"{type(a).__name__}({','.join(_arg(x, index, fresh) for x in a)})"
    if isinstance(a, dict):
        return "{" + ",".join(f"{k!r}:{_arg(v, index, fresh)}" for k, v in a.items()) + "}"
    if isinstance(a, slice):
        return f"slice({_arg(a.start, index, fresh)},{_arg(a.stop, index, fresh)},{_arg(a.step, index, fresh)})"
    if a is Ellipsis:
        return "..."
    if type(a) in _PLAIN or isinstance(a, torch.dtype):
        return f"{type(a).__name__}:{a!r}"
    raise NotShareable(f"a constant of type {type(a).__name__}")


def _meta(node: fx.Node) -> str:
    v = node.meta.get("example_value", node.meta.get("val"))
    if isinstance(v, torch.Tensor):
        if any(not isinstance(s, int) for s in (*v.shape, *v.stride())):
            raise NotShareable("a symbolic size")
        return f"{tuple(v.shape)}{v.stride()}:{v.dtype}:{v.device}:rg{int(v.requires_grad)}"
    return type(v).__name__


def structure(nodes) -> str:
    """The ops of ``nodes`` with values named by position: equal for two calls of identical blocks."""
    index: dict = {}
    lines = []
    for i, n in enumerate(nodes):
        if n.op in ("get_attr", "call_module"):
            raise NotShareable(f"a {n.op} node")
        target = _target_name(n.target) if n.op in ("call_function", "call_method") else n.op
        fresh: list = []  # (kept per node, not found by scanning the index: that was quadratic in the block)
        line = f"{n.op} {target}({_arg(n.args, index, fresh)};{_arg(n.kwargs, index, fresh)})"
        for i_in, node in sorted(fresh, key=lambda f: f[0]):  # describe inputs from outside where first used
            line += f" $in{i_in}={_meta(node)}"
        index[n] = i
        lines.append(line)
    return "\n".join(lines)


def part_key(gm: fx.GraphModule, args: list, key: tuple) -> str:
    """The sharing key of compiling ``gm`` for ``args`` now; raises NotShareable."""
    from ember.aot.cache import NotCacheable, describe_inputs

    if torch._C._are_functorch_transforms_active():
        raise NotShareable("a functorch transform is active")
    h = hashlib.sha256(repr(key).encode())
    h.update(_settings().encode())  # a compile under other settings (native_cpu, $CXX, ...) is not this one
    h.update(structure([n for n in gm.graph.nodes]).encode())
    try:
        describe_inputs(h, args)
    except NotCacheable as exc:
        raise NotShareable(str(exc)) from None
    return h.hexdigest()


def _settings() -> str:
    """Every ember setting and ember environment variable, as the compile now would read them."""
    from ember.config import environment

    fields = sorted((f.name, repr(getattr(config, f.name))) for f in dataclasses.fields(config))
    env = sorted((name, environment.get(name)) for name in environment.VARIABLES)
    return repr((fields, env))


def clear() -> None:
    """Forget every shared compiled callable (``ember.reset()``)."""
    with _lock:
        _SHARED.clear()
        _CAPTURE.clear()


def shared_compile(gm: fx.GraphModule, args: list, compiler, key: tuple):
    """``compiler(gm, args)``, or the callable compiled before for a graph of the same key."""
    try:
        k = part_key(gm, args, key)
    except NotShareable:
        return compiler(gm, args)
    with _lock:
        hit = _SHARED.get(k)
    if hit is not None:
        _bump("reuses")
        return hit
    from ember.cudagraphs.auto import shared_by_call_sites
    with shared_by_call_sites() as facts:  # (each layer's weights are other tensors: no CUDA graph per part)
        compiled = compiler(gm, args)
    if compiled is None:
        compiled = gm.forward
    _bump("compiles")
    with _lock:
        _SHARED.setdefault(k, compiled)
        _CAPTURE[id(compiled)] = (compiled, _merged(facts))
    return compiled


def capture_facts_of(compiled) -> dict | None:
    """What capturing a shared part's compiled callable would face (``auto.part_facts``), or None when
    it was not compiled here or by no graph compiler that reports it (the split is then not replayed)."""
    with _lock:
        hit = _CAPTURE.get(id(compiled))
    return hit[1] if hit is not None and hit[0] is compiled else None


def _merged(facts: list) -> dict:
    if not facts:
        return dict(problem="no graph of it was compiled by ember's code generator", mutates=True, pool=0)
    problem = next((f["problem"] for f in facts if f["problem"]), None)
    return dict(problem=problem, mutates=any(f["mutates"] for f in facts), pool=sum(f["pool"] for f in facts))


# ------------------------------------------------------------------------------------------ split

def plan_regions(gm: fx.GraphModule, example_inputs=None, min_params: int = 0, shapes: dict | None = None) -> dict:
    """node -> region (a module call repeated in the graph), for the nodes inside one.
    ``shapes`` (a dict, filled): region -> its structure (``structure``), equal for identical blocks.

    ``min_params`` (with ``example_inputs``): only calls whose parameters (graph inputs that are
    ``nn.Parameter``) hold at least that many elements, repeated ``AUTO_MIN_CALLS`` times or more;
    checked before any structure is spelled, so that small models pay a walk over the graph only."""
    members: dict = {}  # call -> its nodes, in graph order
    for n in gm.graph.nodes:
        for call in n.meta.get("ember_module_calls", ()):
            members.setdefault(call, []).append(n)
    if min_params:
        params = {n: t.numel() for n, t in zip((n for n in gm.graph.nodes if n.op == "placeholder"), example_inputs)
                  if isinstance(t, torch.nn.Parameter)}
        members = {call: nodes for call, nodes in members.items()
                   if sum(params.get(p, 0) for p in {a for n in nodes for a in n.all_input_nodes}) >= min_params}
    shape_of: dict = {}
    seen: dict = {}
    for call, nodes in members.items():
        if sum(n.op != "output" for n in nodes) < MIN_REGION_OPS:
            continue
        try:
            s = structure(nodes)
        except NotShareable:
            continue
        shape_of[call] = s
        # counted by where the call starts: a wrapper whose forward only calls the module it wraps
        # (a loss wrapper around a whole model) covers the same nodes, and is no second call
        seen.setdefault(s, set()).add(nodes[0])
    need = AUTO_MIN_CALLS if min_params else 2
    repeated = {call for call, s in shape_of.items() if len(seen[s]) >= need}
    while True:
        region_of = {}
        for n in gm.graph.nodes:
            for call in n.meta.get("ember_module_calls", ()):  # outermost first
                if call in repeated:
                    region_of[n] = call
                    break
        # a structure repeated only inside other regions but once outside them (a Llama's final
        # RMSNorm, like those inside each layer) would be a part of its own compiled for one call: it
        # stays in the glue, fused with its neighbours (the head)
        outer: dict = {}
        for call in set(region_of.values()):
            outer.setdefault(shape_of[call], set()).add(call)
        lonely = {call for calls in outer.values() if len(calls) < need for call in calls}
        if not lonely:
            if shapes is not None:
                shapes.update((call, shape_of[call]) for call in set(region_of.values()))
            return region_of
        repeated -= lonely


def split_regions(gm: fx.GraphModule, example_inputs, compiler, key: tuple, min_params: int = 0):
    """The split GraphModule whose repeated blocks are compiled once, or None (nothing repeats;
    ``min_params``: no block that large repeats, see ``plan_regions``)."""
    if any(not isinstance(a, torch.Tensor) for a in example_inputs):
        return None  # symbolic sizes: the parts would need their own size inputs; left whole
    region_of = plan_regions(gm, example_inputs, min_params)
    if not region_of:
        return None
    from ember.aot import mask_simplify
    # before the split: a mask built from sizes in the glue reaches each block as an input, where the
    # autograd layer's own pass (which runs per part) cannot see that it is only a causal pattern;
    # GPT-2's attention then read a mask in every layer (cuDNN's SDPA time 1.8x whole-model's, H100)
    if mask_simplify.simplify_attention_masks(gm):
        region_of = plan_regions(gm, example_inputs, min_params)
        if not region_of:
            return None
    part_of: dict = {}
    parts = 0
    current = object()
    for n in gm.graph.nodes:
        if n.op in ("placeholder", "output"):
            continue
        r = region_of.get(n, ("glue",))
        if r != current or r == ("glue",) and parts == 0:
            parts += 1
            current = r
        part_of[n] = parts - 1
    if not _state_changes_stay_in_one_part(gm, part_of):
        return None
    regions = {region_of[n] for n in region_of}
    runs = {}
    for n, p in part_of.items():
        if n in region_of:
            runs.setdefault(region_of[n], set()).add(p)
    if any(len(ps) > 1 for ps in runs.values()):
        return None  # a call's nodes are not one run: cannot happen as the frontend marks them; stay safe
    from torch.fx.passes.split_module import split_module

    split = split_module(gm, gm, lambda node: part_of[node], keep_original_order=True)
    region_parts = {p for r, ps in runs.items() for p in ps}
    names = sorted((n for n, _ in split.named_children()), key=lambda s: int(s.rsplit("_", 1)[1]))
    for name in names:
        index = int(name.rsplit("_", 1)[1])
        part = getattr(split, name)
        part.meta["ember_split"] = dict(pass_name=PASS_NAME, index=index, count=len(names), parent=id(gm),
                                        region=index in region_parts)
        setattr(split, name, _shared_part(part, compiler, key, split, name))
    split.meta["ember_split"] = dict(pass_name=PASS_NAME, count=len(names), parent=id(gm))
    _bump("splits")
    elog.artifact("graph_code", f"{PASS_NAME}: graph split into {len(names)} parts, {len(region_parts)} of them "
                                f"calls of {len(set(_structure_names(runs)))} repeated block kind(s) "
                                f"({len(regions)} calls)\n{split.code}")
    return split


def _state_changes_stay_in_one_part(gm: fx.GraphModule, part_of: dict) -> bool:
    """Whether every span of the graph that runs under a changed global state (from a grad-mode or
    autocast change to the node restoring the state the graph began in) lies inside one part.

    Each part is traced under the state the graph is called in, so a part boundary inside such a
    span would trace the nodes after it under the wrong state. A span inside one part is traced
    with its changes, as in the whole graph: Llama's rotary embedding (``autocast(enabled=False)``
    around the cos/sin computation, in the glue before the layers) no longer keeps the whole model
    from regional compilation; a layer called under ``no_grad`` still does."""
    grad0 = grad = torch.is_grad_enabled()
    depth = 0
    span_part = None
    for n in gm.graph.nodes:
        if n.op in ("placeholder", "output"):
            continue
        changes = n.op == "call_function" and n.target in _STATE_CHANGES
        if changes:
            if n.target is torch._C._set_grad_enabled:
                if not (n.args and type(n.args[0]) is bool):
                    return False
                grad = n.args[0]
            elif n.target is torch.amp.autocast_mode._enter_autocast:
                depth += 1
            else:
                depth -= 1
        dirty = grad != grad0 or depth != 0
        if changes or dirty or span_part is not None:
            if span_part is None:
                span_part = part_of[n]
            elif part_of[n] != span_part:
                return False
        if not dirty:
            span_part = None
    return span_part is None


def _structure_names(runs) -> list:
    return [call[1] for call in runs]


class RegionalPart(CompiledPart):
    """One part of a split graph: compiled at its first call with that call's inputs (the DDP pass's
    CompiledPart), or the callable of an identical part compiled before. Once compiled it takes
    itself out of the call path: the split GraphModule's attribute becomes the compiled callable, so a
    step pays no ``nn.Module.__call__`` (hooks checks, two frames) and no ``forward`` of this class per
    part: per part and call, only the compiled callable's own frames remain."""

    def __init__(self, gm: fx.GraphModule, compiler, parent: fx.GraphModule, name: str):
        super().__init__(gm, compiler)
        self._parent = weakref.ref(parent)  # (a weakref: a module attribute would be a child module)
        self._name = name

    def forward(self, *args):
        out = super().forward(*args)
        parent = self._parent()
        if parent is not None and parent._modules.get(self._name) is self:
            parent._modules.pop(self._name, None)  # (pop: another thread may be doing the same)
            parent.__dict__[self._name] = self.fn  # found before nn.Module.__getattr__ is consulted
        return out


def _shared_part(gm: fx.GraphModule, compiler, key: tuple, parent: fx.GraphModule, name: str) -> RegionalPart:
    return RegionalPart(gm, functools.partial(shared_compile, compiler=compiler, key=key), parent, name)
