"""``np.random`` inside the compiled function, drawn from torch's random stream (torch.compile's default).

As torch.compile does (through ``torch._numpy.random``), a draw such as ``np.random.rand(3)`` becomes
a graph node making the same torch random op that ``torch._numpy.random`` makes in eager
(``torch.empty(3, dtype=float64).uniform_()``), and ``np.random.seed(n)`` is ``torch.manual_seed(n)``.
So the numbers are torch's, not NumPy's: NumPy's Mersenne Twister cannot be replayed by torch ops;
what holds is that compiled code gives exactly what eager code gives with ``np.random`` replaced by
``torch._numpy.random`` under the same ``torch.manual_seed`` (tests/fullgraph/test_numpy_random.py).
Results are NumPy arrays at the boundary, with NumPy's dtypes (float64 draws, int64 integers).

``ember.config.use_numpy_random_stream = True`` (``torch._dynamo.config.use_numpy_random_stream``
under ``ember run``) keeps NumPy's own stream instead: ``np.random`` calls are then graph breaks
that run NumPy itself, so the numbers are NumPy's exactly. The setting is read when a function is
compiled.

How each part is placed:

- A draw is a graph node calling ``numpy_random_<name>`` below, marked random (kept even when its
  result is unused: it still advances the stream) and traced by backends into torch's random ops.
- ``np.random.seed(n)`` cannot be a graph node: a backend that traces the graph into ATen would run
  ``manual_seed`` once while tracing and drop it (a later call would not reseed). Reseeding only
  matters to the draws after it, so a seed reached before the graph's first draw runs in the entry
  function just before the graph (the same stream for every draw); a seed after a draw of the same
  graph is a graph break.
- A call that cannot be traced (a scalar draw such as ``np.random.rand()``, whose value would be a
  Python number; ``choice(..., p=...)``, which checks the probabilities' values; ``shuffle`` of a
  list) is a graph break that runs the same draw eagerly on torch's stream: ``reconstruct`` gives the
  break the eager form of the function, so every call in compiled code uses one stream. (So the
  function object itself, returned or stored by compiled code, is that eager form, not NumPy's.)

``np.random`` names not in ``GRAPH_FUNCTIONS`` (``permutation``, ``default_rng``, ``beta``, ...) are
not modelled: graph breaks running NumPy itself, on NumPy's stream (torch.compile does the same).
"""
from __future__ import annotations

import functools
import inspect
import math

import torch

from ember.config import config
from ember.frontend.errors import Unsupported
from ember.frontend.variables.base import VariableTracker, guard_id, register_rule, trackers
from ember.frontend.variables.numpy_arrays import (
    NumpyArrayVariable, _dtypes_impl, _from_tnp, as_numpy, np, numpy_call,
)


# ---- the graph side: what torch._numpy.random computes, on tensors ---------------------------
# Each mirrors torch._numpy.random's code op for op (the same ops draw the same numbers); they are
# written out because torch._numpy.random's own functions read torch._dynamo.config at every call.
def _float():
    return _dtypes_impl.default_dtypes().float_dtype  # float64, as NumPy draws


def _shape(size) -> tuple:
    if size is None:
        return ()
    return tuple(size) if isinstance(size, (tuple, list)) else (size,)


def random_sample(size=None):
    return torch.empty(_shape(size), dtype=_float()).uniform_()


def rand(*size):
    return random_sample(size)


def randn(*size):
    return torch.randn(size, dtype=_float())


def uniform(low=0.0, high=1.0, size=None):
    return torch.empty(_shape(size), dtype=_float()).uniform_(low, high)


def normal(loc=0.0, scale=1.0, size=None):
    return torch.empty(_shape(size), dtype=_float()).normal_(loc, scale)


def randint(low, high=None, size=None):
    if high is None:
        low, high = 0, low
    return torch.randint(low, high, size=_shape(size))


def choice(a, size=None, replace=True, p=None):
    """Uniform choice (``p`` given is a break: its sum is checked against 1, a value)."""
    assert p is None, "np.random.choice(p=...) is not traced (NumpyRandomVariable.call)"
    if not isinstance(a, torch.Tensor):
        a = torch.arange(a)
    num = math.prod(_shape(size)) if size is not None else 1
    p = torch.ones_like(a) / a.shape[0]
    indices = torch.multinomial(p, num, replacement=replace)
    if isinstance(size, (tuple, list)):
        indices = indices.reshape(size)
    return a[indices] if size is not None else a[indices][0]


def shuffled(t):
    """``shuffle``'s new contents (the tracker copies them into the array, as torch._numpy does)."""
    return t[torch.randperm(t.shape[0])]


GRAPH_FUNCTIONS = {fn.__name__: fn for fn in (random_sample, rand, randn, uniform, normal, randint, choice)}
GRAPH_FUNCTIONS.update(random=random_sample, sample=random_sample, shuffle=shuffled)
for _name, _fn in list(GRAPH_FUNCTIONS.items()):
    def _node_fn(*args, __fn=_fn, **kwargs):
        return __fn(*args, **kwargs)
    _node_fn.__name__ = _node_fn.__qualname__ = f"numpy_random_{_name}"
    _node_fn.ember_random = True  # kept by dead-code elimination; a seed may not follow it (convert.py)
    GRAPH_FUNCTIONS[_name] = _node_fn
# functions whose scalar result (no size) NumPy gives as a Python number
_PYTHON_SCALAR = {"random_sample", "random", "sample", "rand", "randn", "uniform", "normal", "randint"}


def seed(seed=None):
    """``np.random.seed`` on torch's stream: ``torch.manual_seed``; ``seed()`` with no value leaves the
    stream as it is (torch._numpy.random.seed does too; NumPy would reseed from the OS)."""
    if seed is not None:
        torch.manual_seed(seed)


@functools.cache
def eager_function(name: str):
    """The function a graph break runs for ``np.random.<name>``: the same draw, eagerly, on torch's
    stream; arrays in and out as NumPy's (``shuffle`` changes its array in place)."""
    if name == "seed":
        return seed
    graph_fn = GRAPH_FUNCTIONS[name]

    def run(*args, **kwargs):
        if name == "choice" and isinstance(args[0] if args else kwargs.get("a"), np.ndarray) and \
                (args[0] if args else kwargs["a"]).ndim != 1:
            raise ValueError("a must be 1-dimensional")  # (NumPy's check and message)
        if name == "choice" and _SIGNATURES["choice"].bind(*args, **kwargs).arguments.get("p") is not None:
            # the probabilities given: torch._numpy's choice, which checks them
            import torch._numpy as tnp
            result = _from_tnp(tnp.random.choice.__wrapped__(*_to_tensors(args), **_to_tensors(kwargs)))
        elif name == "shuffle":
            if len(args) != 1 or not isinstance(args[0], np.ndarray):
                return getattr(np.random, name)(*args, **kwargs)  # a list: NumPy's own (not torch's stream)
            target = torch.from_numpy(args[0])
            target.copy_(graph_fn(target))
            return None
        else:
            result = graph_fn(*_to_tensors(args), **_to_tensors(kwargs))
        if isinstance(result, torch.Tensor) and result.dim() == 0:
            return result.item() if name in _PYTHON_SCALAR else as_numpy(result)
        return result.numpy() if isinstance(result, torch.Tensor) else result

    run.__name__ = run.__qualname__ = f"numpy_random_{name}_eager"
    return run


def _to_tensors(values):
    if isinstance(values, dict):
        return {k: _to_tensors(v) for k, v in values.items()}
    if isinstance(values, (tuple, list)):
        return type(values)(_to_tensors(v) for v in values)
    return torch.from_numpy(values) if isinstance(values, np.ndarray) else values


_SIGNATURES = {name: inspect.signature(fn) for name, fn in (
    ("random_sample", random_sample), ("random", random_sample), ("sample", random_sample),
    ("uniform", uniform), ("normal", normal), ("randint", randint), ("choice", choice))}


# ---- the tracker ------------------------------------------------------------------------------
class NumpyRandomVariable(VariableTracker):
    """``np.random.<name>`` for a name of ``GRAPH_FUNCTIONS`` or ``seed``, on torch's stream."""

    def __init__(self, name: str, fn, source=None):
        self.name = name
        self.fn = fn
        self.source = source

    def describe(self):
        return f"numpy.random.{self.name}"

    def call(self, tx, args, kwargs):
        if self.name == "seed":
            return self._seed(tx, args, kwargs)
        if self.name == "shuffle":
            return self._shuffle(tx, args, kwargs)
        values = [*args, *kwargs.values()]
        if any(isinstance(v, trackers.TensorVariable) for v in values):
            raise Unsupported(f"np.random.{self.name} of a torch tensor (eager converts it through __array__)",
                              hint="call .numpy() on the tensor first")
        bound = self._bind(args, kwargs)
        if self.name == "choice":
            if not _is_none(bound.get("p")):
                raise Unsupported("np.random.choice(..., p=...) checks that the probabilities sum to 1 (their values)")
            a = bound["a"]
            if isinstance(a, NumpyArrayVariable) and a.tensor.fake.dim() != 1:
                raise Unsupported("np.random.choice of an array that is not 1-d (ValueError in eager)")
        scalar = not args if self.name in ("rand", "randn") else _is_none(bound.get("size"))
        if scalar:
            raise Unsupported(f"np.random.{self.name}() without a size draws a Python number (a value a graph "
                              "cannot return to Python code)", hint="draw an array: pass size=1")
        return numpy_call(tx, GRAPH_FUNCTIONS[self.name], list(args), kwargs)

    def _bind(self, args, kwargs) -> dict:
        """The arguments by parameter name (rand/randn take sizes only: none)."""
        if self.name in ("rand", "randn"):
            return {}
        try:
            return _SIGNATURES[self.name].bind(*args, **kwargs).arguments
        except TypeError as exc:
            raise Unsupported(f"np.random.{self.name}: {exc} (TypeError in eager)") from None

    def _seed(self, tx, args, kwargs):
        values = [*args, *kwargs.values()]
        if len(values) > 1 or not all(v.is_constant() for v in values):
            raise Unsupported("np.random.seed() of a value not known while tracing")
        value = values[0].as_constant() if values else None
        if value is None:
            return VariableTracker.const(None)
        if not isinstance(value, int) or isinstance(value, bool):
            raise Unsupported(f"np.random.seed({value!r}): only an int seed is traced")
        drawn = tx.output.random_nodes()
        if drawn:
            raise Unsupported(f"np.random.seed() after a random draw of the same graph ({drawn[0]}): the seed runs "
                              "before the graph, so it must come before the graph's first draw")
        tx.output.seeds.append(value)
        return VariableTracker.const(None)

    def _shuffle(self, tx, args, kwargs):
        if kwargs or len(args) != 1 or not isinstance(args[0], NumpyArrayVariable):
            raise Unsupported("np.random.shuffle of something other than a numpy array (torch._numpy shuffles "
                              "arrays only)")
        array = args[0]
        if array.tensor.fake.dim() == 0:
            raise Unsupported("np.random.shuffle of a 0-d array (TypeError in eager)")
        new = numpy_call(tx, GRAPH_FUNCTIONS["shuffle"], [array], {})
        array.tensor.call_method(tx, "copy_", [new.tensor], {})
        return VariableTracker.const(None)

    def reconstruct(self, cg):
        # the value a graph break calls: this draw run eagerly, on the stream the traced draws use
        return cg.const(eager_function(self.name), f"numpy_random_{self.name}")


def _is_none(vt) -> bool:
    return vt is None or vt.is_constant() and vt.as_constant() is None


# the module's attributes are the very objects a trace meets (np.random.rand is a method bound to
# NumPy's global RandomState, stored once): found by identity, never by ``==``
_BY_ID = {} if np is None else {id(getattr(np.random, n)): n for n in (*GRAPH_FUNCTIONS, "seed")}


@register_rule
def _build_numpy_random(tx, value, source):
    name = _BY_ID.get(id(value))
    if name is None or getattr(np.random, name, None) is not value or config.use_numpy_random_stream:
        return None
    guard_id(tx, value, source)
    return NumpyRandomVariable(name, value, source)

