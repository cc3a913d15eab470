"""NumPy inside the compiled function: arrays traced as tensors, NumPy calls as graph ops.

``t.numpy()`` of a CPU tensor that does not require grad is the tensor itself, seen as an array
(eager shares the memory too). A NumPy function, ufunc or array method applied to such an array
becomes one graph node calling a wrapper of the same name in ``torch._numpy`` (PyTorch's NumPy API
written in torch ops, with NumPy's dtype rules; NumPy's default dtypes float64/int64 are set
here, as NumPy has them): under FakeTensors it gives the result's metadata, and a backend traces
through it into ATen ops. ``torch.from_numpy(a)`` / ``torch.as_tensor(a)`` are the tensor again.
At the boundary (returned, or alive at a graph break) an array is rebuilt as ``t.numpy()`` of
the graph's output, and a 0-d result as the NumPy scalar eager gives (``np.sum`` returns
``np.float32(...)``, not an array).

NumPy calls with only constant arguments (``np.finfo(np.float32).eps``, ``np.float32``,
``np.pi * 2``) run for real while tracing. Not modelled, so a graph break: ``np.random`` (its
stream is NumPy's, not torch's), arrays passed in as arguments, in-place array updates, reading an
array's values into Python (``float(a.sum())``), and names ``torch._numpy`` lacks.
"""
from __future__ import annotations

import dataclasses
import operator

import torch

from ember.frontend.errors import Unsupported
from ember.frontend.guards import GuardKind
from ember.frontend.sources import Source
from ember.frontend.variables.base import (
    ConstantVariable, VariableTracker, guard, guard_id, helpers, register_builder, register_rule, trackers,
)
from ember.frontend.variables.functions import TorchFunctionVariable

try:
    import numpy as np
    import torch._numpy as tnp
    from torch._numpy import _dtypes_impl
except ImportError:  # numpy missing: nothing here applies
    np = tnp = _dtypes_impl = None

if _dtypes_impl is not None and _dtypes_impl._default_dtypes is None:
    # NumPy's defaults (torch._numpy would otherwise read them from torch.compile's own config)
    _dtypes_impl._default_dtypes = _dtypes_impl.DefaultDTypes(
        float_dtype=torch.float64, complex_dtype=torch.complex128, int_dtype=torch.int64)


# ---- the graph side: wrappers that run torch._numpy on tensors ---------------------------------
def _to_tnp(v):
    if isinstance(v, torch.Tensor):
        return tnp.ndarray(v)
    if isinstance(v, (list, tuple)):
        return type(v)(_to_tnp(x) for x in v)
    if isinstance(v, type) and np is not None and issubclass(v, np.generic) or np is not None and isinstance(v, np.dtype):
        return np.dtype(v).name  # torch._numpy takes dtype names
    return v


def _from_tnp(r):
    if tnp is not None and isinstance(r, tnp.ndarray):
        return r.tensor
    if isinstance(r, (list, tuple)):
        return type(r)(_from_tnp(x) for x in r)
    return r


_WRAPPERS: dict = {}


def _wrapper(kind: str, name: str):
    """The graph target for ``np.<name>`` (kind "fn"), ``array.<name>(...)`` ("method") or an
    operator ("op"): one function per name, so graphs read ``numpy_sin(x)``."""
    key = (kind, name)
    fn = _WRAPPERS.get(key)
    if fn is None:
        if kind == "fn":
            target = getattr(tnp, name)

            def fn(*args, **kwargs):
                return _from_tnp(target(*_to_tnp(args), **{k: _to_tnp(v) for k, v in kwargs.items()}))
        elif kind == "method":
            def fn(arr, *args, **kwargs):
                return _from_tnp(getattr(tnp.ndarray(arr), name)(*_to_tnp(args),
                                                                **{k: _to_tnp(v) for k, v in kwargs.items()}))
        else:
            op = getattr(operator, name)

            def fn(*args):
                return _from_tnp(op(*_to_tnp(args)))
        fn = _numpy_defaults(fn)
        fn.__name__ = fn.__qualname__ = f"numpy_{'' if kind == 'fn' else kind + '_'}{name}"
        _WRAPPERS[key] = fn
    return fn


def _numpy_defaults(fn):
    """Run ``fn`` with float64 as torch's default dtype: torch._numpy takes some result dtypes
    (``int_array / 2``) from it, where NumPy gives float64."""
    def run(*args, **kwargs):
        saved = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_default_dtype(saved)
    return run


def _np_dtype(fake) -> "np.dtype":
    return np.dtype(str(fake.dtype).removeprefix("torch."))


def as_numpy(tensor_np_result) -> "np.ndarray":
    """An output of the graph as the NumPy value eager gives: an array, or for 0-d a NumPy scalar."""
    arr = tensor_np_result.numpy()
    return arr[()] if arr.ndim == 0 else arr


# ---- the trackers ---------------------------------------------------------------------------
class NumpyArrayVariable(VariableTracker):
    """An ``np.ndarray`` made in the trace; ``tensor`` is the graph value holding its data."""

    def __init__(self, tensor, source=None):
        self.tensor = tensor
        self.source = source  # an array passed in: returned as that very object

    def python_type(self):
        return np.ndarray

    def describe(self):
        return f"numpy array {list(self.tensor.fake.shape)} {_np_dtype(self.tensor.fake)}"

    def as_node_arg(self):
        return self.tensor.as_node_arg()

    def as_fake_arg(self):
        return self.tensor.as_fake_arg()

    def truth(self, tx):
        raise Unsupported("branching on a numpy array's value needs its data, unknown while tracing")

    def length(self, tx):
        if self.tensor.fake.dim() == 0:
            raise Unsupported("len() of a 0-d array (TypeError)")
        return int(self.tensor.fake.shape[0])

    def unpack(self, tx):
        return [self.getitem(tx, ConstantVariable(i)) for i in range(self.length(tx))]

    def iter(self, tx):
        return trackers.ListIteratorVariable(self.unpack(tx))

    def getattr(self, tx, name):
        fake = self.tensor.fake
        if name == "shape":
            return VariableTracker.const(tuple(fake.shape))
        if name == "ndim":
            return VariableTracker.const(fake.dim())
        if name == "size":
            return VariableTracker.const(fake.numel())
        if name == "dtype":
            return VariableTracker.const(_np_dtype(fake))
        if name in ("itemsize", "nbytes"):
            return VariableTracker.const(getattr(np.empty(0, _np_dtype(fake)), "itemsize") * (fake.numel() if name == "nbytes" else 1))
        if name in ("T", "real", "imag", "mT"):
            return numpy_call(tx, _wrapper("method", "__getattribute__"), [self, ConstantVariable(name)], {})
        if hasattr(tnp.ndarray, name) and callable(getattr(tnp.ndarray, name)):
            return trackers.BoundMethodVariable(self, name)
        raise Unsupported(f"numpy array attribute '{name}'")

    def call_method(self, tx, name, args, kwargs):
        if name in ("tolist", "item", "tobytes", "__array__", "__index__", "__int__", "__float__", "__bool__"):
            raise Unsupported(f"ndarray.{name}() needs the array's data, unknown while tracing")
        if name.endswith("_") or name in ("fill", "sort", "resize", "put", "itemset", "setflags") or \
                kwargs.get("out") is not None:
            raise Unsupported(f"ndarray.{name}() changes the array in place")
        if name == "__getitem__":
            return self.getitem(tx, args[0])
        if not hasattr(tnp.ndarray, name):
            raise Unsupported(f"ndarray.{name}() (not in torch._numpy)")
        return numpy_call(tx, _wrapper("method", name), [self, *args], kwargs)

    def getitem(self, tx, key):
        return numpy_call(tx, _wrapper("op", "getitem"), [self, key], {})

    def reconstruct(self, cg):
        if self.source is not None:
            return cg.load(self.source)
        return f"{cg.const(as_numpy, 'as_numpy')}({cg.reconstruct(self.tensor)})"


def numpy_call(tx, fn, args: list, kwargs: dict) -> VariableTracker:
    """A graph node calling ``fn`` (a wrapper above); tensors in the result are arrays again."""
    args = [_graph_arg(tx, a) for a in args]
    kwargs = {k: _graph_arg(tx, v) for k, v in kwargs.items()}
    result = tx.output.call(tx, "call_function", fn, args, kwargs)
    return _as_arrays(result)


def _graph_arg(tx, v):
    """What a graph node can hold: NumPy dtypes by name, NumPy scalars as Python numbers, lists
    as tuples."""
    if isinstance(v, trackers.ListVariable):
        return trackers.TupleVariable([_graph_arg(tx, i) for i in v.unpack(tx)])
    if isinstance(v, trackers.TupleVariable):
        return trackers.TupleVariable([_graph_arg(tx, i) for i in v.items])
    if v.is_constant():
        c = v.as_constant()
        if isinstance(c, np.dtype) or isinstance(c, type) and issubclass(c, np.generic):
            return ConstantVariable(np.dtype(c).name)
        if isinstance(c, np.generic):
            return ConstantVariable(c.item())
    return v


def _as_arrays(vt):
    if isinstance(vt, trackers.TensorVariable):
        return NumpyArrayVariable(vt)
    if isinstance(vt, (trackers.TupleVariable, trackers.ListVariable)):
        return type(vt)([_as_arrays(v) for v in vt.items])
    return vt


_INPLACE = {getattr(operator, f"i{n}"): getattr(operator, n) for n in (
    "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "lshift", "rshift")}
_INPLACE.update({operator.iand: operator.and_, operator.ior: operator.or_, operator.ixor: operator.xor})


@helpers.add
def numpy_operator(tx, fn, a, b) -> "VariableTracker | None":
    """``a <op> b`` where one side is an array (None otherwise). In-place operators update an
    array: not modelled. A tensor on either side follows eager (the tensor's operator wins when
    the tensor is on the left)."""
    if not (isinstance(a, NumpyArrayVariable) or isinstance(b, NumpyArrayVariable)):
        return None
    name = fn.__name__
    if fn in _INPLACE:
        if isinstance(a, NumpyArrayVariable):
            raise Unsupported(f"in-place operator {name} on a numpy array")
        name = _INPLACE[fn].__name__  # `n += array` with a Python number n rebinds: n = n + array
    if isinstance(a, trackers.TensorVariable) or isinstance(b, trackers.TensorVariable):
        raise Unsupported("mixing a numpy array and a tensor in one operation")
    return numpy_call(tx, _wrapper("op", name), [a, b], {})


@helpers.add
def numpy_unary(tx, fn, x) -> "VariableTracker | None":
    if not isinstance(x, NumpyArrayVariable) or fn not in (operator.neg, operator.pos, operator.invert, abs):
        return None
    return numpy_call(tx, _wrapper("fn", "absolute") if fn is abs else _wrapper("op", fn.__name__), [x], {})


@helpers.add
def tensor_as_numpy(tx, tensor, args, kwargs) -> NumpyArrayVariable:
    """``t.numpy()``: the tensor itself, where eager would succeed."""
    force = bool(kwargs["force"].as_constant()) if "force" in kwargs else (args[0].as_constant() if args else False)
    fake = tensor.fake
    if not force and fake.requires_grad:
        raise Unsupported("Tensor.numpy() of a tensor that requires grad (RuntimeError in eager)",
                          hint="call .detach().numpy()")
    if not force and fake.device.type != "cpu":
        raise Unsupported(f"Tensor.numpy() of a {fake.device.type} tensor (TypeError in eager)")
    if force:
        tensor = tx.output.call(tx, "call_method", "detach", [tensor], {})
        if fake.device.type != "cpu":
            tensor = tx.output.call(tx, "call_method", "cpu", [tensor], {})
    return NumpyArrayVariable(tensor)


class NumpyScalarVariable(ConstantVariable):
    """A NumPy scalar made while tracing (``np.float32(2)``, ``np.finfo(...).eps``): a constant that
    enters torch operations as the Python number it equals."""

    def as_node_arg(self):
        return self.value.item()

    def as_fake_arg(self):
        return self.value.item()


class NumpyFunctionVariable(VariableTracker):
    """``np.<name>``: constants fold through NumPy itself; arrays go through ``torch._numpy``."""

    def __init__(self, fn, source=None):
        self.fn = fn
        self.source = source

    def describe(self):
        return f"numpy.{self.fn.__name__}"

    def is_constant(self):
        return True

    def as_constant(self):
        return self.fn

    def call(self, tx, args, kwargs):
        values = [*args, *kwargs.values()]
        if all(v.is_constant() for v in values):
            try:
                result = self.fn(*[a.as_constant() for a in args], **{k: v.as_constant() for k, v in kwargs.items()})
            except Exception as exc:
                raise Unsupported(f"numpy.{self.fn.__name__} raised {type(exc).__name__}: {exc}") from None
            if not isinstance(result, np.ndarray):  # a scalar, dtype, finfo...: a constant
                return NumpyScalarVariable(result) if isinstance(result, np.generic) else VariableTracker.const(result)
            # an array made from constants (np.ones(3)): computed in the graph like any other
        if kwargs.get("out") is not None:
            raise Unsupported(f"numpy.{self.fn.__name__}(out=...) changes an array in place")
        name = self.fn.__name__
        if not hasattr(tnp, name):
            raise Unsupported(f"numpy.{name} (not in torch._numpy)")
        if any(isinstance(v, trackers.TensorVariable) for v in values):
            raise Unsupported(f"numpy.{name} of a torch tensor (eager converts it through __array__)",
                              hint="call .numpy() on the tensor first")
        return numpy_call(tx, _wrapper("fn", name), list(args), kwargs)

    def getattr(self, tx, name):
        return VariableTracker.build_object(tx, getattr(self.fn, name))

    def reconstruct(self, cg):
        if self.source is not None:
            return cg.load(self.source)
        return cg.const(self.fn, self.fn.__name__)


class FromNumpyVariable(TorchFunctionVariable):
    """``torch.from_numpy`` / ``torch.as_tensor`` of an array: the tensor again (eager shares the
    memory too); other arguments are the torch function's."""

    def call(self, tx, args, kwargs):
        if len(args) == 1 and isinstance(args[0], NumpyArrayVariable) and not kwargs:
            return args[0].tensor
        return super().call(tx, args, kwargs)


def _is_numpy_function(value) -> bool:
    if np is None:
        return False
    if isinstance(value, np.ufunc):
        return True
    mod = getattr(value, "__module__", None) or ""
    return callable(value) and not isinstance(value, type) and mod.split(".")[0] == "numpy" \
        and not mod.startswith("numpy.random") and getattr(np, getattr(value, "__name__", ""), None) is value


@register_rule
def _build_numpy(tx, value, source):
    # (identity tests only: ``in`` would call the __eq__ of whatever object is being built)
    if _is_numpy_function(value) or np is not None and (value is np.finfo or value is np.iinfo or value is np.dtype
                                                        or isinstance(value, type) and issubclass(value, np.generic)):
        guard_id(tx, value, source)
        return NumpyFunctionVariable(value, source)
    if value is torch.from_numpy or value is torch.as_tensor:
        guard_id(tx, value, source)
        return FromNumpyVariable(value, source)
    return None


if np is not None:
    @register_builder(np.generic)
    def _build_numpy_scalar(tx, value, source):
        guard(tx, source, GuardKind.CONST, value)
        return NumpyScalarVariable(value, source)

    @register_builder(np.dtype)
    def _build_numpy_dtype(tx, value, source):
        guard(tx, source, GuardKind.CONST, value)
        return ConstantVariable(value, source)

    @register_builder(np.ndarray, exact=True)
    def _build_numpy_input(tx, value, source):
        """An array passed in: a graph input holding ``torch.from_numpy(array)`` (the same memory)."""
        if source is None:
            return None
        if value.dtype.kind not in "biufc" or any(st < 0 for st in value.strides) or value.dtype.byteorder == ">":
            raise Unsupported(f"numpy array {source.name()} of dtype {value.dtype} or with negative strides "
                              "(torch.from_numpy cannot view it)")
        guard(tx, source, GuardKind.TYPE, np.ndarray)
        tensor = tx.output.add_tensor_input(torch.from_numpy(value), FromNumpySource(source))
        return NumpyArrayVariable(tensor, source)


@dataclasses.dataclass(frozen=True)
class FromNumpySource(Source):
    """The tensor viewing the array found at ``parent``."""

    parent: Source

    def render(self, p: str) -> str:
        return f"__import__('torch').from_numpy({p})"

    def expr(self) -> str:
        return self.render(self.parent.expr())

    def name(self) -> str:
        return self.parent.name()

    def base(self) -> Source:
        return self.parent
