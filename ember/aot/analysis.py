"""What a captured graph does to its inputs and how its outputs alias, found by one functionalized run
on fake tensors before any tracing.

The traced (functional) graphs cannot express mutation or aliasing, so this metadata tells the runtime
what to redo around them: copy new values back into mutated inputs, hand back inputs that are returned
as they are, and regenerate outputs that are views of inputs (or of one shared intermediate) from their
base. The graph itself then returns, in this order ("traced outputs"):

    new values of mutated inputs | plain outputs | bases of outputs that alias each other
"""
from __future__ import annotations

import contextlib
import enum
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch._dispatch.python import enable_python_dispatcher
from torch._subclasses.fake_tensor import FakeTensor
from torch.multiprocessing.reductions import StorageWeakRef

from ember.aot.functional import Mutation, functionalize, mutation_of, to_fun


class OutputKind(enum.Enum):
    PLAIN = "plain"                  # a fresh tensor, returned by the compiled graph
    INPUT = "input"                  # the input object itself, returned as is
    ALIAS_OF_INPUT = "alias of input"  # a view of an input: regenerated from the input after the call
    ALIAS_OF_INTERMEDIATE = "alias of intermediate"  # shares storage with another output: regenerated from a traced base
    CONSTANT = "constant"            # a non-tensor value (shapes are static, so it never changes)


@dataclass(frozen=True)
class InputInfo:
    is_tensor: bool
    requires_grad: bool = False
    mutation: Mutation = Mutation()
    is_symint: bool = False  # an int traced as a symbol (dynamic shapes): an input of the traced graphs


@dataclass(frozen=True)
class OutputInfo:
    kind: OutputKind
    requires_grad: bool = False
    source: int = -1      # INPUT/ALIAS_OF_INPUT: input index; PLAIN/ALIAS_OF_INTERMEDIATE: traced-output slot
    value: Any = None     # CONSTANT
    view: tuple | None = None  # (size, stride, storage_offset) of a regenerated alias

    def describe(self) -> str:
        where = {OutputKind.INPUT: f"input {self.source}", OutputKind.ALIAS_OF_INPUT: f"view of input {self.source}",
                 OutputKind.ALIAS_OF_INTERMEDIATE: f"view of traced base #{self.source}",
                 OutputKind.PLAIN: f"traced output #{self.source}", OutputKind.CONSTANT: repr(self.value)}[self.kind]
        return f"{self.kind.value}: {where}" + (", requires grad" if self.requires_grad else "")


@dataclass
class GraphMeta:
    inputs: list[InputInfo]
    outputs: list[OutputInfo]
    mutated: list[int]              # input indices whose new value is a traced output (in this order)
    plain: list[int]                # user output indices returned by the traced graph
    base_reps: list[int]            # per alias group: an output index whose base the graph returns
    traced_requires_grad: list[bool]  # per traced output: does it need a gradient (a tangent)?
    grad_enabled: bool
    traced_specs: list[tuple] = field(default_factory=list)  # per traced output: (shape, dtype, device)
    output_is_tuple: bool = True
    unsupported: str | None = None  # why this graph must run eagerly, if it must
    notes: list[str] = field(default_factory=list)

    @property
    def tensor_indices(self) -> list[int]:
        return [i for i, info in enumerate(self.inputs) if info.is_tensor]

    @property
    def graph_inputs(self) -> list[int]:
        """The inputs the traced graphs take, in order: tensors and symbolic ints (others are baked in)."""
        return [i for i, info in enumerate(self.inputs) if info.is_tensor or info.is_symint]

    @property
    def num_traced_outputs(self) -> int:
        return len(self.mutated) + len(self.plain) + len(self.base_reps)

    def describe(self) -> str:
        lines = [f"inputs: {len(self.inputs)} ({sum(i.requires_grad for i in self.inputs)} need grad), "
                 f"grad mode {'on' if self.grad_enabled else 'off'}"]
        for i in self.mutated:
            m = self.inputs[i].mutation
            lines.append(f"  input {i} is mutated: its new value is copied back after the call"
                         + (" under no_grad (every mutation ran with grad off)" if m.under_no_grad else ""))
        for j, out in enumerate(self.outputs):
            lines.append(f"  output {j}: {out.describe()}")
        lines.extend(f"  note: {n}" for n in self.notes)
        if self.unsupported:
            lines.append(f"  runs eagerly: {self.unsupported}")
        return "\n".join(lines)


def fakeify(args, fake_mode, templates: list | None = None) -> list:
    """Fake copies of the tensor inputs (keeping requires_grad and leaf-ness); other values as they are.

    ``templates`` (dynamic shapes): the graph's placeholder fakes; where one has symbolic sizes the
    copy gets the same symbols, so the traced graphs are valid for every size they allow."""
    return [fake_input(a, fake_mode, templates[i] if templates else None) if isinstance(a, torch.Tensor)
            else templates[i] if templates and is_symint(templates[i]) else a
            for i, a in enumerate(args)]


def fake_input(a: torch.Tensor, fake_mode, template=None) -> torch.Tensor:
    if is_symbolic_tensor(template):
        with fake_mode:
            f = torch.empty_strided(template.shape, template.stride(), dtype=a.dtype, device=a.device)
        return f.requires_grad_(a.requires_grad) if a.requires_grad else f
    return fake_mode.from_tensor(a, static_shapes=True)


def symbolic_dispatch(templates):
    """Python (SymInt-aware) implementations of composite ops while tracing symbolic sizes, as the
    frontend does: a C++ composite reading plain sizes would specialize the symbols."""
    return enable_python_dispatcher() if templates else contextlib.nullcontext()


def is_symbolic_tensor(t) -> bool:
    if not isinstance(t, torch.Tensor):
        return False
    return any(isinstance(s, torch.SymInt) and s.node.expr.free_symbols for s in (*t.shape, *t.stride()))


def is_symint(value) -> bool:
    """An int input the frontend traced as a symbol."""
    return isinstance(value, torch.SymInt) and bool(value.node.expr.free_symbols)


def symbolic_templates(gm: fx.GraphModule):
    """(fake mode, placeholder fakes) when the captured graph has symbolic input sizes or ints, else None."""
    templates = [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]
    if not any(is_symbolic_tensor(t) or is_symint(t) for t in templates):
        return None
    mode = next((t.fake_mode for t in templates if isinstance(t, FakeTensor)), None)
    return (mode, templates) if mode is not None else None


def base_of(t):
    """The tensor whose storage a view was made from (the tensor itself if it is not a view)."""
    return t._base if t._base is not None else t


def collect(gm: fx.GraphModule, args: list, fake_mode, templates: list | None = None) -> GraphMeta:
    grad_enabled = torch.is_grad_enabled()
    fakes = fakeify(args, fake_mode, templates)
    try:
        with fake_mode, functionalize(), symbolic_dispatch(templates):
            f_args = [to_fun(a) for a in fakes]
            outs = gm(*f_args)
    finally:
        torch.set_grad_enabled(grad_enabled)  # in case the graph raised inside a no_grad region

    return meta_of(fakes, f_args, outs, args, grad_enabled, gm)


def meta_of(fakes: list, f_args: list, outs, args: list, grad_enabled: bool, gm=None) -> GraphMeta:
    """The GraphMeta of one functionalized run: ``fakes`` the fake inputs, ``f_args`` their
    functional wrappers after the run, ``outs`` what the graph returned, ``args`` the real inputs."""
    inputs, mutated = [], []
    for i, (arg, f_arg) in enumerate(zip(fakes, f_args)):
        if not isinstance(arg, torch.Tensor):
            inputs.append(InputInfo(False, is_symint=is_symint(arg)))
            continue
        mut = mutation_of(f_arg, arg)
        inputs.append(InputInfo(True, arg.requires_grad, mut))
        if mut.data:
            mutated.append(i)
    meta = GraphMeta(inputs, [], mutated, [], [], [], grad_enabled,
                     output_is_tuple=isinstance(outs, tuple))
    meta.unsupported = _unsupported_inputs(meta, args) or (_lost_out_write(gm, meta, args) if gm is not None else None)
    _classify_outputs(meta, list(outs) if isinstance(outs, (tuple, list)) else [outs], f_args)
    return meta


def _unsupported_inputs(meta: GraphMeta, args: list) -> str | None:
    for i, info in enumerate(meta.inputs):
        if info.mutation.metadata:
            return f"input {i} has its sizes/strides/storage changed in place (e.g. t_, resize_, set_)"
    # The traced graph treats inputs as independent values: a mutation of one input would not be seen by
    # another input that shares its memory.
    storages: dict[tuple, int] = {}
    for i in meta.tensor_indices:
        t = args[i]
        if t.numel() == 0:
            continue
        key = (t.device, t.untyped_storage().data_ptr())
        if key in storages and (meta.inputs[i].mutation.data or meta.inputs[storages[key]].mutation.data):
            return f"inputs {storages[key]} and {i} share memory and one of them is mutated"
        storages.setdefault(key, i)
    return None


def _lost_out_write(gm: fx.GraphModule, meta: GraphMeta, args: list) -> str | None:
    """An input passed as out= that the traced ATen ops never write: a few composite out= overloads
    (linalg.matrix_rank's) trace to their functional op and drop the write into out, which compiled
    would leave out unwritten, silently. Such a graph runs eagerly."""
    index = {n: i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
    for node in gm.graph.nodes:
        out = node.kwargs.get("out") if node.op in ("call_function", "call_method") else None
        if out is None:
            continue
        for leaf in pytree.tree_leaves(out):
            i = index.get(leaf)
            if (i is not None and i not in meta.mutated and isinstance(args[i], torch.Tensor)
                    and args[i].numel()):
                name = getattr(node.target, "__name__", str(node.target))
                return f"the out= tensor of {name} (input {i}) is not written by the ATen ops it traces to"
    return None


def _classify_outputs(meta: GraphMeta, outs: list, f_args: list) -> None:
    input_ids = {id(a): i for i, a in enumerate(f_args) if isinstance(a, torch.Tensor)}
    input_storages = {}
    for i, a in enumerate(f_args):
        if isinstance(a, torch.Tensor):
            input_storages.setdefault(StorageWeakRef(a.untyped_storage()), i)
    # group the remaining tensor outputs by storage: two outputs sharing one must stay aliased
    groups: dict[StorageWeakRef, list[int]] = {}
    for j, o in enumerate(outs):
        if isinstance(o, torch.Tensor) and id(o) not in input_ids:
            ref = StorageWeakRef(o.untyped_storage())
            if ref not in input_storages:
                groups.setdefault(ref, []).append(j)

    traced = [f_args[i] for i in meta.mutated]  # the traced outputs, in slot order
    shared: dict[int, int] = {}  # output index -> base slot (filled after plain outputs are numbered)
    pending_bases = []
    for members in groups.values():
        if len(members) < 2:
            continue
        root = base_of(outs[members[0]])
        if any(base_of(outs[j]) is not root for j in members):
            meta.unsupported = f"outputs {members} share memory without one common base tensor"
            continue
        pending_bases.append((members[0], root))
        for j in members:
            shared[j] = len(pending_bases) - 1

    result = []
    for j, o in enumerate(outs):
        if not isinstance(o, torch.Tensor):
            result.append(OutputInfo(OutputKind.CONSTANT, value=o))
            continue
        view = (tuple(o.size()), tuple(o.stride()), o.storage_offset())
        if any(isinstance(v, torch.SymInt) for v in (*view[0], *view[1], view[2])) and \
                id(o) not in input_ids and (j in shared or StorageWeakRef(o.untyped_storage()) in input_storages):
            # regenerating an aliased output needs its sizes at run time; not done yet (a fresh
            # output with symbolic sizes is fine: the traced graph computes it)
            meta.unsupported = f"output {j} aliases another tensor and has symbolic sizes"
        if id(o) in input_ids:
            result.append(OutputInfo(OutputKind.INPUT, o.requires_grad, input_ids[id(o)]))
        elif (ref := StorageWeakRef(o.untyped_storage())) in input_storages:
            src = input_storages[ref]
            if o.dtype != f_args[src].dtype:
                meta.unsupported = f"output {j} views input {src} with another dtype"
            result.append(OutputInfo(OutputKind.ALIAS_OF_INPUT, o.requires_grad, src, view=view))
        elif j in shared:
            is_base = o is pending_bases[shared[j]][1]  # returned as is, not as a view of itself
            result.append(OutputInfo(OutputKind.ALIAS_OF_INTERMEDIATE, o.requires_grad, shared[j],
                                     view=None if is_base else view))
        else:
            result.append(OutputInfo(OutputKind.PLAIN, o.requires_grad, len(traced)))
            meta.plain.append(j)
            traced.append(o)
    # base slots come after the plain outputs
    first_base = len(traced)
    for rep, root in pending_bases:
        meta.base_reps.append(rep)
        traced.append(root)
        if root.dtype != outs[rep].dtype:
            meta.unsupported = f"output {rep} views an intermediate with another dtype"
    meta.outputs = [OutputInfo(o.kind, o.requires_grad, first_base + o.source, view=o.view)
                    if o.kind is OutputKind.ALIAS_OF_INTERMEDIATE else o for o in result]
    meta.traced_requires_grad = [t.requires_grad for t in traced]
    meta.traced_specs = [(tuple(t.shape), t.dtype, t.device) for t in traced]
    if pending_bases:
        meta.notes.append(f"{len(pending_bases)} group(s) of outputs share memory; each is regenerated "
                          "from one base returned by the graph, so they stay aliased")
