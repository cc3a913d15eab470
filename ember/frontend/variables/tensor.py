"""Tensors in the graph: each TensorVariable is one FX node with its FakeTensor example."""
from __future__ import annotations

import dataclasses
import operator

import torch

from ember.frontend.errors import Unsupported
from ember.frontend.guards import GuardKind
from ember.frontend.sources import AttrSource, Source
from ember.frontend.variables.base import (
    ConstantVariable, MethodTable, VariableTracker, helpers, register_builder, trackers,
)

# Properties answered from the fake tensor's metadata (guards on the inputs make them constants).
_META_PROPS = {
    "dtype", "device", "shape", "ndim", "is_cuda", "is_cpu", "is_meta", "layout", "is_sparse",
    "is_quantized", "is_leaf", "requires_grad", "is_nested", "is_mkldnn", "is_complex_dtype", "itemsize",
    "nbytes", "is_mps", "is_xpu",
}
# Properties that are tensors themselves: become graph nodes via getattr.
_TENSOR_PROPS = {"T", "mT", "H", "mH", "real", "imag"}


class TensorVariable(VariableTracker):
    def __init__(self, node, fake, source=None):
        self.node = node
        self.fake = fake
        self.source = source

    def python_type(self) -> type:
        return torch.nn.Parameter if isinstance(self.fake, torch.nn.Parameter) else torch.Tensor

    def describe(self) -> str:
        src = f" {self.source.name()}" if self.source is not None else ""
        return f"tensor{src} {list(self.fake.shape)} {self.fake.dtype}"

    def as_node_arg(self):
        return self.node

    def as_fake_arg(self):
        return self.fake

    def truth(self, tx) -> bool:
        raise Unsupported(
            "branching on a tensor's value (if/while/bool() on a tensor) needs its data, unknown while tracing",
            hint="use torch.where, or move the branch out of the compiled function")

    def length(self, tx) -> int:
        if self.fake.dim() == 0:
            raise Unsupported("len() of a 0-d tensor")
        return int(self.fake.shape[0])

    def as_index(self, tx) -> int:
        """``lst[t]`` with a 0-d integer tensor: Python calls ``t.__index__()``, which reads the data.
        An input tensor's value is known while tracing: specialize on it under a value guard (as
        torch.compile does); a tensor computed in the graph has no value yet, so that stays a break."""
        fake = self.fake
        if fake.numel() != 1 or fake.dim() != 0 or fake.dtype.is_floating_point or fake.dtype.is_complex \
                or fake.dtype is torch.bool:
            raise Unsupported(f"indexing with {self.describe()} (only a 0-d integer tensor is an index)")
        node = self.node
        if self.source is None and node.op == "call_function" and node.target in (torch.tensor, torch.as_tensor) \
                and node.args and type(node.args[0]) is int:
            return node.args[0]  # torch.tensor(2) made in the graph from a Python int: its value is that int
        real = helpers.input_value(tx, self.source) if self.source is not None else None
        if real is None:
            raise Unsupported(f"indexing with {self.describe()}, computed in the graph, needs its value",
                              hint="index with a Python int, or pass the index tensor in as an argument")
        value = int(real.item())
        tx.output.guards.add(TensorValueSource(self.source), GuardKind.CONST, value)
        return value

    def unpack(self, tx) -> list:
        n = self.length(tx)
        return [tx.output.call(tx, "call_function", operator.getitem, [self, _c(i)], {}) for i in range(n)]

    def getattr(self, tx, name: str) -> VariableTracker:
        if name == "shape":
            return self.sizes(tx, "size")
        if name in _META_PROPS:
            return VariableTracker.const(getattr(self.fake, name))
        if name in _TENSOR_PROPS:
            return tx.output.call(tx, "call_function", getattr, [self, _c(name)], {})
        if name == "grad":
            return self._grad(tx)
        if name == "data":
            return tx.output.call(tx, "call_method", "detach", [self], {})
        if name == "__class__":
            return VariableTracker.const(self.python_type())
        attr = getattr(torch.Tensor, name, None)
        if attr is None:
            # an attribute set on the input tensor itself (x.test = ..., a method stored on a Parameter)
            real = helpers.input_value(tx, self.source) if self.source is not None else None
            if real is not None and name in real.__dict__:
                return VariableTracker.build(tx, real.__dict__[name], AttrSource(self.source, name))
            raise AttributeError(f"'Tensor' object has no attribute '{name}'")
        if callable(attr):
            return TensorMethodVariable(self, name)
        raise Unsupported(f"reading Tensor.{name}")

    def call_method(self, tx, name: str, args: list, kwargs: dict) -> VariableTracker:
        return TensorMethodVariable(self, name).call(tx, args, kwargs)

    def _grad(self, tx) -> VariableTracker:
        """``p.grad`` of a leaf the frame received (a parameter, an input): the gradient is one more
        input of the graph, guarded as any (None, or its metadata), read afresh at every call. Nothing
        traced replaces it: a write (``p.grad = None``) and ``backward()`` / ``torch.autograd.backward``
        are breaks, after which the resumed code reads it again (an in-place op on it is an input
        mutation).
        A tensor made in the graph, or a non-leaf (eager warns at each read), stays a break."""
        real = helpers.input_value(tx, self.source) if self.source is not None else None
        if real is None or not real.is_leaf:
            raise Unsupported("reading Tensor.grad of a tensor that is not a leaf input of the compiled function")
        return VariableTracker.build(tx, real.grad, AttrSource(self.source, "grad"))

    def sizes(self, tx, kind: str) -> VariableTracker:
        """``x.shape`` / ``x.size()`` / ``x.stride()``: constants where static, symbolic ints where not."""
        items = [helpers.size_item(tx, self, kind, d) for d in range(self.fake.dim())]
        if all(isinstance(i, ConstantVariable) for i in items):
            return VariableTracker.const(getattr(self.fake, kind)())
        return trackers.SizeVariable(items) if kind == "size" else trackers.TupleVariable(items)

    def reconstruct(self, cg) -> str:
        return cg.tensor(self)


class TensorMethodVariable(VariableTracker):
    """``x.method`` before it is called."""

    def __init__(self, tensor: TensorVariable, name: str):
        self.tensor = tensor
        self.name = name

    def describe(self) -> str:
        return f"Tensor.{self.name}"

    def call(self, tx, args, kwargs):
        name = self.name
        if name in ("size", "stride") and not kwargs:
            if not args:
                return self.tensor.sizes(tx, name)
            dim = args[0].as_constant()
            return helpers.size_item(tx, self.tensor, name, dim % max(self.tensor.fake.dim(), 1))
        if name == "requires_grad_" and self.tensor.source is not None:
            raise Unsupported("Tensor.requires_grad_() on an input inside a compiled function")
        if name in ("__bool__", "__len__"):
            raise Unsupported(f"Tensor.{name}()")
        if name == "__iter__" and not args and not kwargs:  # what `for y in x` does: rows, as graph values
            return self.tensor.iter(tx)
        if name == "numpy":
            return helpers.tensor_as_numpy(tx, self.tensor, args, kwargs)
        if name == "untyped_storage" and not args and not kwargs:
            return UntypedStorageVariable(self.tensor)
        return tx.output.call(tx, "call_method", name, [self.tensor, *args], kwargs)

    def reconstruct(self, cg) -> str:
        return f"{cg.reconstruct(self.tensor)}.{self.name}"


class UntypedStorageVariable(VariableTracker):
    """``t.untyped_storage()``: its size is metadata (answered, under a guard); its address and
    contents are data, so reading them stays a break. The size of an input's storage is not part of
    the tensor guard (a view of a larger tensor passes it), so reading it guards it: the input's
    own, or every input's for an intermediate (which inputs it views is not tracked)."""

    METHODS = MethodTable()

    def __init__(self, tensor: TensorVariable):
        self.tensor = tensor

    def python_type(self) -> type:
        return torch.UntypedStorage

    def describe(self) -> str:
        return f"untyped storage of {self.tensor.describe()}"

    def nbytes(self, tx) -> int:
        t = self.tensor
        if t.source is not None:
            real = helpers.input_value(tx, t.source)
            nbytes = real.untyped_storage().nbytes()
            tx.output.guards.add(StorageSizeSource(t.source), GuardKind.CONST, nbytes)
            return nbytes
        for source, value, _ in tx.output.inputs:
            if isinstance(value, torch.Tensor):
                tx.output.guards.add(StorageSizeSource(source), GuardKind.CONST, value.untyped_storage().nbytes())
        return int(t.fake.untyped_storage().nbytes())

    def length(self, tx) -> int:
        return self.nbytes(tx)

    def getattr(self, tx, name):
        if name == "device":
            return VariableTracker.const(self.tensor.fake.device)
        if name in ("is_cuda", "is_cpu"):
            return VariableTracker.const(getattr(self.tensor.fake.untyped_storage(), name))
        return trackers.BoundMethodVariable(self, name)

    def method_missing(self, tx, name, args, kwargs):
        raise Unsupported(f"UntypedStorage.{name}() needs the storage's data or changes it",
                          hint="keep storage operations out of the compiled function")

    @METHODS("nbytes", "size", "__len__")
    def _nbytes(self, tx, args, kwargs):
        return VariableTracker.const(self.nbytes(tx))

    @METHODS("element_size")
    def _element_size(self, tx, args, kwargs):
        return VariableTracker.const(1)

    def reconstruct(self, cg) -> str:
        return f"{cg.reconstruct(self.tensor)}.untyped_storage()"


@dataclasses.dataclass(frozen=True)
class StorageSizeSource(Source):
    """The byte size of the storage of the tensor found at ``parent``."""

    parent: Source

    def render(self, p: str) -> str:
        return f"{p}.untyped_storage().nbytes()"

    def expr(self) -> str:
        return self.render(self.parent.expr())

    def name(self) -> str:
        return f"{self.parent.name()}.untyped_storage().nbytes()"

    def base(self) -> Source:
        return self.parent


@dataclasses.dataclass(frozen=True)
class TensorValueSource(Source):
    """The Python number held by a 0-d tensor found at ``parent`` (what a value guard checks)."""

    parent: Source

    def render(self, p: str) -> str:
        return f"{p}.item()"

    def expr(self) -> str:
        return self.render(self.parent.expr())

    def name(self) -> str:
        return f"{self.parent.name()}.item()"

    def base(self) -> Source:
        return self.parent


@helpers.add
def input_value(tx, source) -> "torch.Tensor | None":
    """The real tensor a graph input was made from (known while tracing), or None."""
    for src, value, _ in tx.output.inputs:
        if src == source:
            return value
    return None


@helpers.add
def tensor_min_max(tx, fn, items: list) -> VariableTracker:
    """``max(a, b, ...)`` / ``min([...])`` over one-element tensors. CPython keeps the running best
    and replaces it when ``item > best`` (``<`` for min), whose truth reads the data; the same choice
    as a graph is ``torch.where(item > best, item, best)``, folded left to right. That keeps eager's
    value, NaN behaviour (a comparison with NaN is False: the earlier item stays) and gradient (it
    flows to the chosen tensor only). Items of other shapes, dtypes or devices make eager raise or
    return an item whose metadata the graph cannot pick: those stay a break."""
    first = items[0].fake
    for it in items:
        f = it.fake
        if f.numel() != 1 or f.shape != first.shape or f.dtype != first.dtype or f.device != first.device:
            raise Unsupported(f"{fn.__name__}() over tensors of different shapes/dtypes or with more than one "
                              "element compares their data", hint=f"use torch.{fn.__name__}imum")
    op = operator.gt if fn is max else operator.lt
    best = items[0]
    for it in items[1:]:
        better = tx.output.call(tx, "call_function", op, [it, best], {})
        best = tx.output.call(tx, "call_function", torch.where, [better, it, best], {})
    return best


def _c(v):
    return ConstantVariable(v)


@register_builder(torch.Tensor)
def _build_tensor(tx, value, source):
    if source is None:
        return None  # a tensor made by code ember does not trace: an opaque object
    if type(value) not in (torch.Tensor, torch.nn.Parameter):
        raise Unsupported(f"tensor subclass {type(value).__name__} at {source.name()}")
    if value.layout != torch.strided:  # sparse (COO, CSR...) and mkldnn tensors: no strides to guard on
        raise Unsupported(f"{value.layout} tensor at {source.name()}: ember compiles strided (dense) tensors only",
                          hint="pass a dense tensor (.to_dense()), or call this code outside the compiled function")
    return tx.output.add_tensor_input(value, source)
