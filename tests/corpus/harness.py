"""Registry, input factories and the recursive comparer of the differential corpus.

A case is a Python function (or an ``nn.Module`` factory) plus a deterministic input factory.
The runner (``run_case``) calls the function eagerly and through ``ember.compile(...,
fullgraph=True)`` on two identical sets of inputs and demands identical results: outputs (same
types, same Python values, same tensors), inputs after the call (mutation), gradients when an
output requires grad, and a cache hit on a second call with fresh inputs of the same metadata.

Case files only import ``case`` / ``module_case`` from here; ``ember`` is imported lazily by the
runner so that the registry can be built (and inspected) without it.
"""
from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any, Callable, Optional

import torch

INPUT_SEED = 1234        # seed of the input factory, first call
FRESH_INPUT_SEED = 4321  # seed of the input factory, cache-hit call
CALL_SEED = 77           # torch.manual_seed right before every eager / compiled call
MODEL_SEED = 5           # seed under which module cases build their module


@dataclasses.dataclass
class Case:
    name: str
    fn: Callable                      # the function, or (is_module) a factory of the module
    inputs: Callable[[], tuple]       # fresh positional arguments on every call
    kwargs: Optional[Callable[[], dict]] = None
    is_module: bool = False
    train: bool = False               # module cases: mode set before the calls
    atol: Optional[float] = None
    rtol: Optional[float] = None
    topic: str = ""
    # Set for constructs that are a graph break by design (e.g. data-dependent output shapes before
    # dynamic shapes exist): a regex the fullgraph error must match. The case then checks that
    # fullgraph=True fails with that clear error and that fullgraph=False still matches eager.
    breaks: Optional[str] = None

    def __repr__(self) -> str:
        return f"Case({self.name})"


CASES: list[Case] = []
_NAMES: set[str] = set()


def _register(c: Case) -> Case:
    if c.name in _NAMES:
        raise ValueError(f"duplicate corpus case name {c.name!r}")
    _NAMES.add(c.name)
    CASES.append(c)
    return c


def _topic(module_name: str) -> str:
    base = module_name.rsplit(".", 1)[-1]
    return base[len("cases_"):] if base.startswith("cases_") else base


def case(inputs: Optional[Callable[[], tuple]] = None, *, kwargs=None, name=None, atol=None,
         rtol=None, breaks=None):
    """Register a function case. ``inputs`` returns a tuple of fresh positional arguments."""

    def deco(fn):
        topic = _topic(fn.__module__)
        _register(Case(name=f"{topic}.{name or fn.__name__}", fn=fn,
                       inputs=inputs or (lambda: ()), kwargs=kwargs, atol=atol, rtol=rtol,
                       topic=topic, breaks=breaks))
        return fn

    return deco


def module_case(name: str, make: Callable[[], torch.nn.Module], inputs: Callable[[], tuple], *,
                train: bool = False, kwargs=None, atol=None, rtol=None, topic: str = "modules"):
    """Register a module case: ``make()`` builds the module (under a fixed seed)."""
    return _register(Case(name=f"{topic}.{name}", fn=make, inputs=inputs, kwargs=kwargs,
                          is_module=True, train=train, atol=atol, rtol=rtol, topic=topic))


def load_all_cases() -> list[Case]:
    """Import every case file (registration happens at import) and return the registry."""
    from . import (cases_arith, cases_builtins, cases_containers, cases_control,  # noqa: F401
                   cases_datamodel, cases_functions, cases_grad, cases_modules, cases_mutation,
                   cases_semantics, cases_signatures, cases_structures, cases_torch_api)
    return CASES


# --------------------------------------------------------------------------------------------
# inputs

def make_inputs(c: Case, seed: int):
    torch.manual_seed(seed)
    args = c.inputs()
    if not isinstance(args, tuple):
        raise TypeError(f"{c.name}: the inputs factory must return a tuple, got {type(args)}")
    kwargs = c.kwargs() if c.kwargs is not None else {}
    return args, kwargs


def make_module(c: Case) -> torch.nn.Module:
    torch.manual_seed(MODEL_SEED)
    m = c.fn()
    m.train(c.train)
    return m


# --------------------------------------------------------------------------------------------
# walking and comparing

def _is_namedtuple(x) -> bool:
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


def iter_tensors(obj, path="out"):
    """Yield (path, tensor) for every tensor leaf of a nested structure."""
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, torch.nn.Module):
        return
    elif _is_namedtuple(obj):
        for f in type(obj)._fields:
            yield from iter_tensors(getattr(obj, f), f"{path}.{f}")
    elif isinstance(obj, (tuple, list)):
        for i, v in enumerate(obj):
            yield from iter_tensors(v, f"{path}[{i}]")
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from iter_tensors(v, f"{path}[{k!r}]")
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from iter_tensors(getattr(obj, f.name), f"{path}.{f.name}")
    elif hasattr(obj, "__dict__") and not isinstance(obj, type) and \
            type(obj).__module__ not in ("builtins", "torch"):
        for k, v in vars(obj).items():
            yield from iter_tensors(v, f"{path}.{k}")


def assert_same(expected, actual, path="out", *, atol=None, rtol=None):
    """Recursively assert that ``actual`` (compiled) equals ``expected`` (eager)."""
    te, ta = type(expected), type(actual)
    assert te is ta, f"{path}: type {ta.__name__} != eager {te.__name__}"
    if isinstance(expected, torch.Tensor):
        assert actual.shape == expected.shape, f"{path}: shape {actual.shape} != eager {expected.shape}"
        assert actual.dtype == expected.dtype, f"{path}: dtype {actual.dtype} != eager {expected.dtype}"
        assert actual.device == expected.device, f"{path}: device {actual.device} != {expected.device}"
        assert actual.layout == expected.layout, f"{path}: layout {actual.layout} != {expected.layout}"
        assert actual.requires_grad == expected.requires_grad, \
            f"{path}: requires_grad {actual.requires_grad} != eager {expected.requires_grad}"
        torch.testing.assert_close(actual.detach(), expected.detach(), equal_nan=True,
                                   atol=atol, rtol=rtol, msg=lambda m: f"{path}: {m}")
        return
    if _is_namedtuple(expected):
        assert len(actual) == len(expected), f"{path}: len {len(actual)} != eager {len(expected)}"
        for f in te._fields:
            assert_same(getattr(expected, f), getattr(actual, f), f"{path}.{f}", atol=atol, rtol=rtol)
        return
    if isinstance(expected, (tuple, list)):
        assert len(actual) == len(expected), f"{path}: len {len(actual)} != eager {len(expected)}"
        for i, (e, a) in enumerate(zip(expected, actual)):
            assert_same(e, a, f"{path}[{i}]", atol=atol, rtol=rtol)
        return
    if isinstance(expected, dict):
        assert list(actual.keys()) == list(expected.keys()), \
            f"{path}: keys {list(actual.keys())} != eager {list(expected.keys())}"
        for k in expected:
            assert_same(expected[k], actual[k], f"{path}[{k!r}]", atol=atol, rtol=rtol)
        if hasattr(expected, "default_factory"):
            assert actual.default_factory == expected.default_factory, f"{path}: default_factory"
        return
    if isinstance(expected, float):
        if math.isnan(expected):
            assert math.isnan(actual), f"{path}: {actual!r} != eager nan"
        else:
            assert actual == expected, f"{path}: {actual!r} != eager {expected!r}"
        return
    if isinstance(expected, (int, bool, str, bytes, type(None), complex, torch.dtype, torch.device,
                             slice, range, set, frozenset, torch.memory_format, torch.layout)):
        assert actual == expected, f"{path}: {actual!r} != eager {expected!r}"
        return
    if dataclasses.is_dataclass(expected) and not isinstance(expected, type):
        for f in dataclasses.fields(expected):
            assert_same(getattr(expected, f.name), getattr(actual, f.name), f"{path}.{f.name}",
                        atol=atol, rtol=rtol)
        return
    if isinstance(expected, type) or callable(expected) and not hasattr(expected, "__dict__"):
        assert actual is expected, f"{path}: {actual!r} is not eager's {expected!r}"
        return
    if hasattr(expected, "__dict__"):
        assert_same(dict(vars(expected)), dict(vars(actual)), f"{path}.__dict__", atol=atol, rtol=rtol)
        return
    assert actual == expected, f"{path}: {actual!r} != eager {expected!r}"


def iter_identity_objects(obj, path="out"):
    """Yield (path, object) for every tensor and every mutable container / user object of a nested
    structure (the objects whose identity Python code can observe)."""
    if isinstance(obj, torch.Tensor):
        yield path, obj
        return
    if isinstance(obj, (torch.nn.Module, type)) or obj is None:
        return
    if isinstance(obj, (list, dict, set)) or (
            (dataclasses.is_dataclass(obj) or hasattr(obj, "__dict__")) and not _is_namedtuple(obj)
            and not callable(obj) and type(obj).__module__ not in ("builtins", "torch")):
        yield path, obj
    if _is_namedtuple(obj):
        for f in type(obj)._fields:
            yield from iter_identity_objects(getattr(obj, f), f"{path}.{f}")
    elif isinstance(obj, (tuple, list)):
        for i, v in enumerate(obj):
            yield from iter_identity_objects(v, f"{path}[{i}]")
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from iter_identity_objects(v, f"{path}[{k!r}]")
    elif dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            yield from iter_identity_objects(getattr(obj, f.name), f"{path}.{f.name}")
    elif hasattr(obj, "__dict__") and not callable(obj) and \
            type(obj).__module__ not in ("builtins", "torch"):
        for k, v in vars(obj).items():
            yield from iter_identity_objects(v, f"{path}.{k}")


def assert_same_aliasing(out_e, out_c, in_e, in_c):
    """An output that *is* an input (or another output) in eager must be so when compiled too;
    this covers tensors and mutable containers / objects, whose identity Python code can see."""
    ins_e = {}
    for p, o in iter_identity_objects(in_e, "in"):
        ins_e.setdefault(id(o), p)
    ins_c = {}
    for p, o in iter_identity_objects(in_c, "in"):
        ins_c.setdefault(id(o), p)
    outs_e = list(iter_identity_objects(out_e))
    outs_c = list(iter_identity_objects(out_c))
    assert [p for p, _ in outs_e] == [p for p, _ in outs_c], \
        f"output structure differs: {[p for p, _ in outs_c]} != eager {[p for p, _ in outs_e]}"
    first_e, first_c = {}, {}
    for (p, oe), (_, oc) in zip(outs_e, outs_c):
        src_e, src_c = ins_e.get(id(oe)), ins_c.get(id(oc))
        assert src_e == src_c, (f"{p}: eager output is input {src_e}, compiled output is input "
                                f"{src_c} (identity of returned inputs must be preserved)")
        same_e, same_c = first_e.setdefault(id(oe), p), first_c.setdefault(id(oc), p)
        assert same_e == same_c, (f"{p}: eager output is the same object as {same_e}, compiled "
                                  f"output is the same object as {same_c}")


def _grad_seed(t: torch.Tensor) -> torch.Tensor:
    """A deterministic, position-dependent output gradient (catches transposed/permuted grads)."""
    n = max(t.numel(), 1)
    g = (torch.arange(t.numel(), dtype=torch.float64).reshape(t.shape) + 1.0) / n
    return g.to(t.dtype)


def backward_outputs(out) -> bool:
    ts = [t for _, t in iter_tensors(out) if t.requires_grad]
    if not ts:
        return False
    torch.autograd.backward(ts, grad_tensors=[_grad_seed(t) for t in ts])
    return True


def grads_of(args, module=None):
    g = {p: t.grad for p, t in iter_tensors(args, "in") if t.is_leaf and t.requires_grad}
    if module is not None:
        for n, prm in module.named_parameters():
            g[f"param {n}"] = prm.grad
    return g


def _plain(v) -> bool:
    if isinstance(v, (int, float, bool, str, type(None))):
        return True
    if isinstance(v, (tuple, list)):
        return all(_plain(x) for x in v)
    if isinstance(v, dict):
        return all(_plain(k) and _plain(x) for k, x in v.items())
    return False


def module_state(m: torch.nn.Module) -> dict:
    """Parameters, buffers, and plain Python attributes (ints, strings, flags...) of every submodule."""
    st = {f"param {n}": p for n, p in m.named_parameters()}
    st.update({f"buffer {n}": b for n, b in m.named_buffers()})
    for name, sub in m.named_modules():
        for k, v in vars(sub).items():
            if not k.startswith("_") and _plain(v):
                st[f"attr {name + '.' if name else ''}{k}"] = v
    return st


# --------------------------------------------------------------------------------------------
# the runner

def _same_values(a, b) -> bool:
    try:
        assert_same(a, b)
        return True
    except AssertionError:
        return False


def _computes_tensors(out, args_after, pristine) -> bool:
    """True when eager produced a tensor that is not an input, or mutated an input tensor: then
    a correct compile must have handed a graph to the backend."""
    inputs = {id(t) for _, t in iter_tensors(args_after, "in")}
    if any(id(t) not in inputs for _, t in iter_tensors(out)):
        return True
    return not _same_values(pristine, args_after)


def _call(fn, args, kwargs):
    torch.manual_seed(CALL_SEED)
    return fn(*args, **kwargs)


def run_breaking_case(c: Case) -> None:
    """A construct ember refuses to put in a graph: a clear error under fullgraph, eager otherwise."""
    import re
    import warnings

    import pytest

    import ember

    args, kw = make_inputs(c, INPUT_SEED)
    with pytest.raises(ember.CompileError) as info:
        _call(ember.compile(c.fn, fullgraph=True), args, kw)
    assert re.search(c.breaks, str(info.value)), f"error does not explain the break: {info.value}"
    assert ".py:" in str(info.value), "the error must name the user's file:line"
    args_e, kw_e = make_inputs(c, INPUT_SEED)
    args_c, kw_c = make_inputs(c, INPUT_SEED)
    out_e = _call(c.fn, args_e, kw_e)
    compiled = ember.compile(c.fn)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out_c = _call(compiled, args_c, kw_c)
    cache = compiled._ember_cache
    recorded = [b for e in cache.entries for b in e.breaks]
    # either a graph break (recorded on the entry, logged) or a whole-frame fallback (a warning)
    assert recorded or any("ember" in str(w.message) for w in caught), "the break or fallback must be recorded"
    if recorded:
        assert re.search(c.breaks, recorded[0].reason), f"the recorded break does not explain it: {recorded[0]}"
    assert_same(out_e, out_c, "output", atol=c.atol, rtol=c.rtol)
    assert_same((args_e, kw_e), (args_c, kw_c), "inputs after the call", atol=c.atol, rtol=c.rtol)


def run_case(c: Case) -> None:
    import ember
    from ember.testing import CompileCounter, cache_of

    if c.breaks:
        return run_breaking_case(c)
    tol = dict(atol=c.atol, rtol=c.rtol)
    if c.is_module:
        eager = make_module(c)
        target = copy.deepcopy(eager)
        cnt = CompileCounter()
        compiled = ember.compile(target, backend=cnt, fullgraph=True)
        assert isinstance(compiled, torch.nn.Module), \
            f"ember.compile(module) must return a wrapper nn.Module, got {type(compiled).__name__}"
    else:
        eager = target = c.fn
        cnt = CompileCounter()
        compiled = ember.compile(c.fn, backend=cnt, fullgraph=True)

    # first call: outputs, mutated inputs, aliasing, gradients
    args_e, kw_e = make_inputs(c, INPUT_SEED)
    args_c, kw_c = make_inputs(c, INPUT_SEED)
    pristine = make_inputs(c, INPUT_SEED)
    state_before = copy.deepcopy(module_state(eager)) if c.is_module else None
    out_e = _call(eager, args_e, kw_e)
    out_c = _call(compiled, args_c, kw_c)
    needs_graph = _computes_tensors(out_e, (args_e, kw_e), pristine)
    if c.is_module:
        needs_graph = needs_graph or not _same_values(state_before, module_state(eager))
    assert_same(out_e, out_c, "output", **tol)
    assert_same_aliasing(out_e, out_c, (args_e, kw_e), (args_c, kw_c))
    assert_same((args_e, kw_e), (args_c, kw_c), "inputs after the call", **tol)
    if c.is_module:
        assert_same(module_state(eager), module_state(target), "module state after the call", **tol)
    if backward_outputs(out_e):
        assert backward_outputs(out_c), "compiled outputs do not require grad"
        assert_same(grads_of((args_e, kw_e), eager if c.is_module else None),
                    grads_of((args_c, kw_c), target if c.is_module else None), "grad", **tol)

    # second call, fresh inputs of the same metadata: same results, and a cache hit
    args_e, kw_e = make_inputs(c, FRESH_INPUT_SEED)
    args_c, kw_c = make_inputs(c, FRESH_INPUT_SEED)
    out_e = _call(eager, args_e, kw_e)
    out_c = _call(compiled, args_c, kw_c)
    assert_same(out_e, out_c, "output (second call)", **tol)
    assert_same((args_e, kw_e), (args_c, kw_c), "inputs after the second call", **tol)

    cache = cache_of(compiled)
    assert cache.compile_count == 1, \
        f"second call recompiled: compile_count={cache.compile_count}, reasons={cache.recompile_reasons}"
    assert not cache.recompile_reasons, f"unexpected recompiles: {cache.recompile_reasons}"
    assert cnt.frame_count <= 1, f"fullgraph compile produced {cnt.frame_count} frames"
    if needs_graph:
        assert cnt.frame_count == 1, ("the case computes or mutates tensors but the backend never "
                                      "received a graph (frame_count == 0)")
