"""Registry and runner of the graph-break differential suite (eager PyTorch is the oracle).

A case is a function (``@case``) or an object factory (``obj_case``: an ``nn.Module`` or a plain
object whose method is compiled) whose body contains at least one graph break. The runner:

1. builds an *eager world* (``setup()`` resets the case module's globals, the object is built under
   a fixed seed), calls the function eagerly on the call schedule ``CALLS`` and records, per call:
   the output, the printed text (stdout, ``logging`` records of ``tests.breaks`` loggers and user
   warnings, in program order), the exception (type + message), the inputs after the call, the
   case's state (globals named by ``setup``, the object's parameters / buffers / attributes, extra
   ``state``), grad mode / autocast after the call, aliasing of outputs with inputs / state, and the
   gradients after ``.backward()`` when an output requires grad;
2. builds an identical *compiled world* and does the same through ``ember.compile(fn,
   backend=CompileCounter())`` (whose graphs leave grad mode as they found it, as the autograd
   layer's do), comparing each call with eager's record;
3. checks the counter saw at least ``min_graphs`` graphs over the whole call schedule, and
   (``breaks=True``) that ``fullgraph=True`` raises ``ember.CompileError`` in a fresh world.

``min_graphs`` is at least 1: a break case still compiles the work before and after its break, and
a case that accepted zero graphs would pass while ember compiled nothing. A case that ember cannot
compile yet (a known frontend limit) declares ``xfail="why"``: the test is a strict expected failure
and flips to a failure (XPASS) when the limit is lifted.

The call schedule: three calls with fresh inputs of the same metadata (size ``N``), a call with a
different size or Python scalar (``N_RECOMPILE``, forcing a recompile), then back to ``N``. An
input factory takes ``n`` (and optionally the call index ``i``) and returns the positional
arguments; cases use ``n`` as a tensor size or as a Python scalar.

Case files only import ``case`` / ``obj_case`` (and helpers) from here; ember is imported lazily.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import io
import logging
import math
import sys
import traceback
import warnings
from typing import Any, Callable, Optional

import torch

N = 4
N_RECOMPILE = 6
CALLS = [(0, N), (1, N), (2, N), (3, N_RECOMPILE), (4, N)]   # (call index, n)
INPUT_SEED = 1000   # + call index: torch.manual_seed before building the inputs of a call
CALL_SEED = 77      # + call index: torch.manual_seed right before every eager / compiled call
MODEL_SEED = 5      # seed under which setup() and object factories run
LOGGER = "tests.breaks"  # cases log through children of this logger


@dataclasses.dataclass
class Case:
    name: str
    fn: Callable                          # function; or (obj case) factory of the object
    module: str                           # the case file (its globals are the case's globals)
    inputs: Callable                      # (n) or (n, i) -> tuple of positional arguments
    kwargs: Optional[Callable] = None     # (n) or (n, i) -> dict of keyword arguments
    setup: Optional[Callable] = None      # () -> {global name: fresh value}; compared after each call
    state: Optional[Callable] = None      # (obj or None) -> extra Python-visible state to compare
    before_call: Optional[Callable] = None  # (obj, i): run on both worlds before call i
    method: Optional[str] = None          # obj case: compile getattr(obj, method) instead of obj
    is_obj: bool = False
    train: Optional[bool] = None          # obj case (nn.Module): mode set after building
    min_graphs: int = 1
    xfail: Optional[str] = None           # known limit: strict expected failure, with the reason
    breaks: bool = True                   # fullgraph=True must raise ember.CompileError
    grad: bool = True                     # backward + compare grads when an output requires grad
    # tolerances: None = torch's defaults for the dtype (fp32: rtol 1.3e-6, atol 1e-5); a float for
    # every call, or a function of the call index for cases whose precision changes between calls
    atol: Any = None
    rtol: Any = None
    topic: str = ""

    def __repr__(self) -> str:
        return f"Case({self.name})"


CASES: list[Case] = []
_NAMES: set[str] = set()


def _register(c: Case) -> Case:
    if c.name in _NAMES:
        raise ValueError(f"duplicate breaks case name {c.name!r}")
    if c.min_graphs < 1:
        raise ValueError(f"breaks case {c.name!r}: min_graphs={c.min_graphs} would pass when nothing "
                         "compiles; give the case tensor work outside its break region and expect its "
                         "graphs, or mark a known limit with xfail='why'")
    _NAMES.add(c.name)
    CASES.append(c)
    return c


def _topic(module_name: str) -> str:
    base = module_name.rsplit(".", 1)[-1]
    return base[len("cases_"):] if base.startswith("cases_") else base


def case(inputs: Optional[Callable] = None, *, name=None, kwargs=None, setup=None, state=None,
         before_call=None, min_graphs=1, xfail=None, breaks=True, grad=True, atol=None, rtol=None):
    """Register a function case (``before_call(None, i)`` runs before call i in both worlds)."""

    def deco(fn):
        topic = _topic(fn.__module__)
        _register(Case(name=f"{topic}.{name or fn.__name__}", fn=fn, module=fn.__module__,
                       inputs=inputs or (lambda n: ()), kwargs=kwargs, setup=setup, state=state,
                       before_call=before_call, min_graphs=min_graphs, xfail=xfail, breaks=breaks,
                       grad=grad, atol=atol, rtol=rtol, topic=topic))
        return fn

    return deco


def obj_case(name: str, make: Callable, inputs: Callable, *, method=None, train=None, kwargs=None,
             setup=None, state=None, before_call=None, min_graphs=1, xfail=None, breaks=True,
             grad=True, atol=None, rtol=None):
    """Register an object case: ``make()`` builds the module / object (under MODEL_SEED) in each
    world; ``ember.compile(obj)`` (modules) or ``ember.compile(getattr(obj, method))`` is called."""
    module = sys._getframe(1).f_globals["__name__"]
    topic = _topic(module)
    return _register(Case(name=f"{topic}.{name}", fn=make, module=module, inputs=inputs,
                          kwargs=kwargs, setup=setup, state=state, before_call=before_call,
                          method=method, is_obj=True, train=train, min_graphs=min_graphs,
                          xfail=xfail, breaks=breaks, grad=grad, atol=atol, rtol=rtol, topic=topic))


CASE_FILES = ("cases_print", "cases_values", "cases_branches", "cases_calls", "cases_loops",
              "cases_modules", "cases_exceptions", "cases_grad", "cases_effects", "cases_args",
              "cases_frame", "cases_guards", "cases_order", "cases_datamodel")


def load_all_cases() -> list[Case]:
    import importlib

    pkg = __name__.rsplit(".", 1)[0]
    for f in CASE_FILES:
        importlib.import_module(f"{pkg}.{f}")
    return CASES


# --------------------------------------------------------------------------------------------
# snapshots: detached, deep copies of Python-visible values (compared after the world moved on)

@dataclasses.dataclass
class TensorSnap:
    value: torch.Tensor
    requires_grad: bool
    is_leaf: bool


@dataclasses.dataclass
class ObjSnap:
    type: type
    attrs: dict


@dataclasses.dataclass
class ExcSnap:
    type: type
    message: str
    cause: Any = None       # (type, message) of __cause__, when set
    args: Any = None


def _is_namedtuple(x) -> bool:
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


def module_state(m: torch.nn.Module) -> dict:
    """Parameters, buffers, mode and plain Python attributes of every submodule."""
    st: dict = {f"param {n}": p for n, p in m.named_parameters()}
    st.update({f"buffer {n}": b for n, b in m.named_buffers()})
    for name, sub in m.named_modules():
        pre = name + "." if name else ""
        st[f"training {pre}"] = sub.training
        for k, v in vars(sub).items():
            if not k.startswith("_") and k != "training" and not isinstance(v, torch.nn.Module):
                st[f"attr {pre}{k}"] = v
    return st


def snap(x, depth=0):
    if depth > 12:
        return "<too deep>"
    if isinstance(x, torch.Tensor):
        return TensorSnap(x.detach().clone(), x.requires_grad, x.is_leaf)
    if isinstance(x, torch.nn.Module):
        return ObjSnap(type(x), {k: snap(v, depth + 1) for k, v in module_state(x).items()})
    if isinstance(x, BaseException):
        cause = x.__cause__
        return ExcSnap(type(x), str(x), (type(cause), str(cause)) if cause is not None else None,
                       snap(x.args, depth + 1))
    if type(x).__module__ == "numpy" and hasattr(x, "tolist"):
        return ObjSnap(type(x), {"dtype": str(getattr(x, "dtype", "")),
                                 "shape": getattr(x, "shape", None), "value": x.tolist()})
    if _is_namedtuple(x):
        return type(x)(*(snap(v, depth + 1) for v in x))
    if isinstance(x, (list, tuple)):
        return type(x)(snap(v, depth + 1) for v in x) if type(x) in (list, tuple) else \
            ObjSnap(type(x), {"items": [snap(v, depth + 1) for v in x]})
    if isinstance(x, dict):
        d = {k: snap(v, depth + 1) for k, v in x.items()}
        if type(x) is not dict:
            return ObjSnap(type(x), {"items": d, "extra": snap(getattr(x, "default_factory", None))})
        return d
    if isinstance(x, (set, frozenset)):
        return type(x)(x)
    if isinstance(x, (int, float, bool, str, bytes, complex, type(None), torch.dtype, torch.device,
                      slice, range, type)) or callable(x) and not hasattr(x, "__dict__"):
        return x
    if inspect.isfunction(x) or inspect.ismethod(x) or inspect.isgenerator(x):
        return ObjSnap(type(x), {"id": "<callable>"})
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return ObjSnap(type(x), {f.name: snap(getattr(x, f.name), depth + 1) for f in dataclasses.fields(x)})
    if hasattr(x, "__dict__"):
        return ObjSnap(type(x), {k: snap(v, depth + 1) for k, v in vars(x).items()})
    try:
        return copy.deepcopy(x)
    except Exception:
        return repr(x)


def assert_same(expected, actual, path="out", *, atol=None, rtol=None):
    """Recursively assert that the compiled snapshot ``actual`` equals eager's ``expected``."""
    te, ta = type(expected), type(actual)
    assert te is ta, f"{path}: type {ta.__name__} != eager {te.__name__} ({actual!r} vs eager {expected!r})"
    if isinstance(expected, TensorSnap):
        e, a = expected.value, actual.value
        assert a.shape == e.shape, f"{path}: shape {tuple(a.shape)} != eager {tuple(e.shape)}"
        assert a.dtype == e.dtype, f"{path}: dtype {a.dtype} != eager {e.dtype}"
        assert actual.requires_grad == expected.requires_grad, \
            f"{path}: requires_grad {actual.requires_grad} != eager {expected.requires_grad}"
        assert actual.is_leaf == expected.is_leaf, f"{path}: is_leaf {actual.is_leaf} != eager {expected.is_leaf}"
        torch.testing.assert_close(a, e, equal_nan=True, atol=atol, rtol=rtol,
                                   msg=lambda m: f"{path}: values differ: {m}")
        return
    if isinstance(expected, ExcSnap):
        assert (actual.type, actual.message) == (expected.type, expected.message), \
            f"{path}: {actual.type.__name__}({actual.message!r}) != eager {expected.type.__name__}({expected.message!r})"
        assert actual.cause == expected.cause, f"{path}: __cause__ {actual.cause} != eager {expected.cause}"
        assert_same(expected.args, actual.args, f"{path}.args")
        return
    if isinstance(expected, ObjSnap):
        assert actual.type is expected.type, f"{path}: type {actual.type} != eager {expected.type}"
        assert_same(expected.attrs, actual.attrs, f"{path}<{expected.type.__name__}>", atol=atol, rtol=rtol)
        return
    if isinstance(expected, (tuple, list)):
        assert len(actual) == len(expected), \
            f"{path}: len {len(actual)} != eager {len(expected)} ({_short(actual)} vs eager {_short(expected)})"
        for i, (e, a) in enumerate(zip(expected, actual)):
            assert_same(e, a, f"{path}[{i}]", atol=atol, rtol=rtol)
        return
    if isinstance(expected, dict):
        assert list(actual.keys()) == list(expected.keys()), \
            f"{path}: keys {list(actual.keys())} != eager {list(expected.keys())}"
        for k in expected:
            assert_same(expected[k], actual[k], f"{path}[{k!r}]", atol=atol, rtol=rtol)
        return
    if isinstance(expected, float) and math.isnan(expected):
        assert math.isnan(actual), f"{path}: {actual!r} != eager nan"
        return
    assert actual == expected, f"{path}: {actual!r} != eager {expected!r}"


def describe_exception(e: BaseException, frames: int = 3) -> str:
    """The last few frames and the first lines of the message of an exception (for reports)."""
    tb = traceback.extract_tb(e.__traceback__)[-frames:]
    lines = [f"    {fr.filename.replace('/work/main/', '')}:{fr.lineno} in {fr.name}" for fr in tb]
    msg = str(e).strip().splitlines()
    head = "\n".join(msg[:3]) + (" [...]" if len(msg) > 3 else "")
    return "\n".join(lines) + f"\n    {type(e).__name__}: {head[:600]}"


def _first_lines(text: str, k: int) -> str:
    lines = text.strip().splitlines()
    return " | ".join(x.strip() for x in lines[:k])


def _short(x, n=160):
    r = repr(x)
    return r if len(r) <= n else r[:n] + "..."


# --------------------------------------------------------------------------------------------
# aliasing: which outputs are inputs / state objects (by identity), and which outputs are shared

def _identity_objects(obj, path, out, depth=0):
    if depth > 8:
        return
    if isinstance(obj, torch.Tensor):
        out.append((path, obj))
        return
    if obj is None or isinstance(obj, (type, int, float, str, bool, bytes)):
        return
    if isinstance(obj, torch.nn.Module):
        out.append((path, obj))
        return
    mutable = isinstance(obj, (list, dict, set)) or (hasattr(obj, "__dict__") and not callable(obj)
                                                      and type(obj).__module__ not in ("builtins", "torch"))
    if mutable:
        out.append((path, obj))
    if isinstance(obj, (tuple, list)):
        for i, v in enumerate(obj):
            _identity_objects(v, f"{path}[{i}]", out, depth + 1)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _identity_objects(v, f"{path}[{k!r}]", out, depth + 1)
    elif mutable and hasattr(obj, "__dict__"):
        for k, v in vars(obj).items():
            _identity_objects(v, f"{path}.{k}", out, depth + 1)


def alias_signature(out, roots: dict) -> list:
    """For each identity-carrying object of the output: (path, the root path it is, the first
    output path it is the same object as)."""
    known: dict = {}
    for rname, r in roots.items():
        objs: list = []
        _identity_objects(r, rname, objs)
        for p, o in objs:
            known.setdefault(id(o), p)
    objs = []
    _identity_objects(out, "out", objs)
    first: dict = {}
    return [(p, known.get(id(o)), first.setdefault(id(o), p)) for p, o in objs]


# --------------------------------------------------------------------------------------------
# one world: globals, object, calls

class _LogToStdout(logging.Handler):
    """Writes ``tests.breaks`` log records into the (redirected) stdout, keeping program order."""

    def emit(self, record):
        sys.stdout.write(f"[log {record.levelname} {record.name}] {record.getMessage()}\n")


def _grad_seed(t: torch.Tensor) -> torch.Tensor:
    n = max(t.numel(), 1)
    return ((torch.arange(t.numel(), dtype=torch.float64).reshape(t.shape) + 1.0) / n).to(t.dtype)


def _leaf_tensors(x, path, out, seen, depth=0):
    if depth > 8:
        return
    if isinstance(x, torch.Tensor):
        if x.is_leaf and x.requires_grad and id(x) not in seen:
            seen.add(id(x))
            out.append((path, x))
    elif isinstance(x, torch.nn.Module):
        for n, p in x.named_parameters():
            if id(p) not in seen:
                seen.add(id(p))
                out.append((f"{path}.{n}", p))
    elif isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            _leaf_tensors(v, f"{path}[{i}]", out, seen, depth + 1)
    elif isinstance(x, dict):
        for k, v in x.items():
            _leaf_tensors(v, f"{path}[{k!r}]", out, seen, depth + 1)
    elif hasattr(x, "__dict__") and not callable(x) and type(x).__module__ not in ("builtins", "torch"):
        for k, v in vars(x).items():
            _leaf_tensors(v, f"{path}.{k}", out, seen, depth + 1)


def _out_tensors(x, out, depth=0):
    if depth > 8:
        return
    if isinstance(x, torch.Tensor):
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for v in x:
            _out_tensors(v, out, depth + 1)
    elif isinstance(x, dict):
        for v in x.values():
            _out_tensors(v, out, depth + 1)


def _arity(f) -> int:
    try:
        return len(inspect.signature(f).parameters)
    except (TypeError, ValueError):
        return 1


def _factory_call(f, n, i):
    return f(n, i) if _arity(f) >= 2 else f(n)


class World:
    def __init__(self, c: Case):
        self.c = c
        self.mod = sys.modules[c.module]
        torch.manual_seed(MODEL_SEED)
        self.global_names: list[str] = []
        if c.setup is not None:
            fresh = c.setup()
            for k, v in fresh.items():
                setattr(self.mod, k, v)
            self.global_names = list(fresh)
        self.obj = None
        if c.is_obj:
            torch.manual_seed(MODEL_SEED)
            self.obj = c.fn()
            if c.train is not None:
                self.obj.train(c.train)

    def target(self):
        if not self.c.is_obj:
            return self.c.fn
        return getattr(self.obj, self.c.method) if self.c.method else self.obj

    def inputs(self, n, i):
        torch.manual_seed(INPUT_SEED + i)
        args = _factory_call(self.c.inputs, n, i)
        if not isinstance(args, tuple):
            raise TypeError(f"{self.c.name}: the inputs factory must return a tuple, got {type(args)}")
        kwargs = _factory_call(self.c.kwargs, n, i) if self.c.kwargs is not None else {}
        return args, kwargs

    def state_roots(self) -> dict:
        roots = {f"global {k}": getattr(self.mod, k) for k in self.global_names}
        if self.obj is not None:
            roots["obj"] = self.obj
        return roots

    def state(self):
        st = {k: snap(v) for k, v in self.state_roots().items()}
        if self.c.state is not None:
            st["extra"] = snap(self.c.state(self.obj))
        return st

    def call(self, fn, n, i) -> dict:
        """Run call ``i``; return its record (snapshots only)."""
        c = self.c
        if c.before_call is not None:
            c.before_call(self.obj, i)
        args, kwargs = self.inputs(n, i)
        buf = io.StringIO()
        logger = logging.getLogger(LOGGER)
        handler = _LogToStdout(level=logging.DEBUG)
        old_level, old_prop = logger.level, logger.propagate
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
        out, exc, tb = None, None, None
        grad_before = torch.is_grad_enabled()
        try:
            with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(buf):
                warnings.simplefilter("always")
                torch.manual_seed(CALL_SEED + i)
                try:
                    out = fn(*args, **kwargs)
                except Exception as e:  # noqa: BLE001 - compared with eager's
                    exc, tb = e, describe_exception(e)
        finally:
            logger.removeHandler(handler)
            logger.setLevel(old_level)
            logger.propagate = old_prop
        case_file = getattr(self.mod, "__file__", None)
        user_warnings = [f"{w.category.__name__}: {w.message}" for w in caught
                         if w.filename == case_file and not str(w.message).startswith("ember")]
        rec = {
            "output": snap(out),
            "exception": snap(exc) if exc is not None else None,
            "printed": buf.getvalue(),
            "warnings": user_warnings,
            "inputs after the call": snap((args, kwargs)),
            "state after the call": self.state(),
            "grad mode after the call": torch.is_grad_enabled(),
            "autocast after the call": torch.is_autocast_enabled("cpu"),
            "aliasing": alias_signature(out, {"args": (args, kwargs), **self.state_roots()}),
        }
        rec["_traceback"] = tb
        rec["_ember_warnings"] = [str(w.message) for w in caught if str(w.message).startswith("ember")]
        torch.set_grad_enabled(grad_before)
        if c.grad and exc is None:
            outs: list = []
            _out_tensors(out, outs)
            outs = [t for t in outs if t.requires_grad]
            rec["outputs requiring grad"] = len(outs)
            if outs:
                torch.autograd.backward(outs, grad_tensors=[_grad_seed(t) for t in outs])
                leaves: list = []
                seen: set = set()
                _leaf_tensors((args, kwargs), "in", leaves, seen)
                for k, v in self.state_roots().items():
                    _leaf_tensors(v, k, leaves, seen)
                rec["grads after backward"] = {p: snap(t.grad) for p, t in leaves}
        return rec


def call_tolerance(c: Case, i: int) -> dict:
    """The case's atol / rtol for call ``i``."""
    return {k: (v(i) if callable(v) else v) for k, v in (("atol", c.atol), ("rtol", c.rtol))}


def compare_records(expected: dict, actual: dict, label: str, c: Case, i: int = 0):
    """Compare one call's records; raise an AssertionError listing every difference."""
    tol = call_tolerance(c, i)
    if (expected["exception"] is None) != (actual["exception"] is None):
        if actual["exception"] is not None:
            raise AssertionError(f"{label}: compiled raised but eager did not:\n{actual['_traceback']}")
        e = expected["exception"]
        raise AssertionError(f"{label}: eager raised {e.type.__name__}({e.message!r}) but compiled "
                             f"returned {_short(actual['output'])}")
    diffs: list[str] = []
    if expected["exception"] is not None:
        try:
            assert_same(expected["exception"], actual["exception"], f"{label}: exception")
        except AssertionError as err:
            diffs.append(f"{err}\n  compiled traceback tail:\n{actual['_traceback']}")
    if actual["printed"] != expected["printed"]:
        diffs.append(f"{label}: printed text differs:\n--- compiled\n{actual['printed']}--- eager\n"
                     f"{expected['printed']}---")
    for key in expected:
        if key.startswith("_") or key in ("exception", "printed"):
            continue
        if key not in actual:
            diffs.append(f"{label}: {key}: missing in compiled run")
            continue
        try:
            assert_same(expected[key], actual[key], f"{label}: {key}", **tol)
        except AssertionError as err:
            diffs.append(str(err))
    if diffs:
        raise AssertionError("\n".join(diffs))


CHILD_TIMEOUT_S = 60


def _mode_keeping_counter():
    """A CompileCounter whose graphs, like those of ember's autograd layer (the default backend), leave
    grad mode as they found it: the fx graph's own ``_set_grad_enabled`` nodes would otherwise hand
    the caller a mode that only the entry function is meant to set (a grad mode the traced code left
    switched went unnoticed by this suite while the default backend leaked it)."""
    from ember.testing import CompileCounter

    class ModeKeepingCounter(CompileCounter):
        def __call__(self, gm, example_inputs):
            forward = super().__call__(gm, example_inputs)

            def run(*args):
                grad = torch.is_grad_enabled()
                try:
                    return forward(*args)
                finally:
                    torch._C._set_grad_enabled(grad)
            return run
    return ModeKeepingCounter()


def _compiled_phase(c: Case, records: list) -> list[str]:
    """The compiled world and the fullgraph check; returns the list of problems found."""
    import ember

    problems: list[str] = []
    w_c = World(c)
    cnt = _mode_keeping_counter()
    compiled = ember.compile(w_c.target(), backend=cnt)
    fallbacks: list[str] = []
    for (i, n), exp in zip(CALLS, records):
        label = f"call {i} (n={n})"
        try:
            act = w_c.call(compiled, n, i)
            fallbacks += [m for m in act["_ember_warnings"] if m not in fallbacks]
            compare_records(exp, act, label, c, i)
        except AssertionError as e:
            problems.append(str(e))
            break
        except Exception as e:  # noqa: BLE001 - an ember crash outside the call (e.g. in backward)
            problems.append(f"{label}: crash outside the call:\n{describe_exception(e)}")
            break
    if cnt.frame_count < c.min_graphs:
        why = "".join(f"\n    ember warned: {_first_lines(m, 2)}" for m in fallbacks[:2])
        problems.append(f"the backend received {cnt.frame_count} graph(s), expected >= {c.min_graphs}{why}")

    # fullgraph=True must refuse the break with ember.CompileError
    if c.breaks:
        w_f = World(c)
        full = ember.compile(w_f.target(), fullgraph=True)
        args, kwargs = w_f.inputs(N, 0)
        buf = io.StringIO()
        try:
            with contextlib.redirect_stdout(buf), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.manual_seed(CALL_SEED)
                full(*args, **kwargs)
        except ember.CompileError:
            pass
        except Exception as e:  # noqa: BLE001
            problems.append(f"fullgraph=True raised {type(e).__name__}, expected ember.CompileError:\n"
                            + describe_exception(e))
        else:
            problems.append("fullgraph=True did not raise ember.CompileError for a case that breaks")
        torch.set_grad_enabled(True)
        torch.set_autocast_enabled("cpu", False)
    return problems


def _run_case_inline(c: Case) -> list[str]:
    """Both worlds and the checks, in this process; returns the list of problems found."""
    threads = torch.get_num_threads()
    dtype = torch.get_default_dtype()
    torch.set_num_threads(1)  # same reduction order in both worlds
    try:
        w_e = World(c)
        eager_fn = w_e.target()
        records = [w_e.call(eager_fn, n, i) for i, n in CALLS]
        for r in records:
            if r["exception"] is None:
                r.pop("_traceback")
        return _compiled_phase(c, records)
    finally:
        torch.set_num_threads(threads)
        torch.set_grad_enabled(True)
        torch.set_autocast_enabled("cpu", False)
        torch.set_default_dtype(dtype)


class _Worker:
    """A forked child that runs cases by name and sends back their problems. A case that crashes
    the interpreter (generated bytecode can segfault CPython) or hangs kills only this worker: the
    case fails with the signal, and the next case gets a fresh fork. Forked once for many cases
    (not per case) to keep the suite fast."""

    def __init__(self):
        import os

        import tempfile

        torch.set_num_threads(1)  # the child must never wait on OpenMP threads of its parent
        self.cmd_r, self.cmd_w = os.pipe()
        self.res_r, self.res_w = os.pipe()
        fd, self.fault_path = tempfile.mkstemp(prefix="ember-breaks-fault-", suffix=".txt")
        os.close(fd)
        self.pid = os.fork()
        if self.pid == 0:
            import faulthandler

            os.close(self.cmd_w)
            os.close(self.res_r)
            # a crash's Python traceback goes to a file the parent quotes in the case's report
            self._fault_file = open(self.fault_path, "w")  # noqa: SIM115 - lives as long as the child
            faulthandler.enable(file=self._fault_file, all_threads=False)
            self._serve()
        os.close(self.cmd_r)
        os.close(self.res_w)

    def _serve(self):
        import os
        import pickle

        code = 0
        try:
            by_name = {c.name: c for c in CASES}
            with os.fdopen(self.cmd_r, "rb") as cmd, os.fdopen(self.res_w, "wb") as res:
                for line in cmd:
                    name = line.decode().strip()
                    try:
                        result = _run_case_inline(by_name[name])
                    except BaseException as e:  # noqa: BLE001
                        result = [f"harness error:\n{describe_exception(e, 6)}"]
                    data = pickle.dumps([str(p) for p in result])
                    res.write(len(data).to_bytes(8, "little") + data)
                    res.flush()
        except BaseException:  # noqa: BLE001
            code = 1
        finally:
            os._exit(code)

    def run(self, name: str) -> list[str]:
        import os
        import pickle
        import select
        import signal
        import time

        os.write(self.cmd_w, name.encode() + b"\n")
        buf = b""
        need = None
        deadline = time.monotonic() + CHILD_TIMEOUT_S
        while need is None or len(buf) < need:
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(self.pid, signal.SIGKILL)
                self.close()
                return [f"the compiled run hung (killed after {CHILD_TIMEOUT_S} s)"]
            ready, _, _ = select.select([self.res_r], [], [], left)
            if not ready:
                continue
            chunk = os.read(self.res_r, 1 << 20)
            if not chunk:  # the worker died
                _, status = os.waitpid(self.pid, 0)
                self.pid = None
                frames = self._fault_frames()
                self.close()
                if os.WIFSIGNALED(status):
                    sig = os.WTERMSIG(status)
                    return [f"the run crashed the interpreter: signal {sig} ({signal.Signals(sig).name})"
                            + frames]
                return [f"the worker exited without a result (status {status})"]
            buf += chunk
            if need is None and len(buf) >= 8:
                need = 8 + int.from_bytes(buf[:8], "little")
        return pickle.loads(buf[8:need])

    def _fault_frames(self) -> str:
        """The crash's innermost frames, up to the harness (from faulthandler's dump)."""
        try:
            with open(self.fault_path) as f:
                lines = f.read().splitlines()
        except OSError:
            return ""
        frames = []
        for line in lines:
            if line.strip().startswith("File "):
                if "tests/breaks/harness.py" in line:
                    break
                frames.append("    " + line.strip().replace("/work/main/", ""))
        return ("\n  most recent call first:\n" + "\n".join(frames[:12])) if frames else ""

    def close(self):
        import os

        for fd in (self.cmd_w, self.res_r):
            try:
                os.close(fd)
            except OSError:
                pass
        if self.pid:
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass
            self.pid = None
        try:
            os.unlink(self.fault_path)
        except OSError:
            pass


_WORKER: list = []   # the live worker, if any


def _close_worker() -> None:
    if _WORKER:
        _WORKER.pop().close()


def _worker() -> _Worker:
    if not _WORKER:
        import atexit

        _warm_up()
        _WORKER.append(_Worker())
        atexit.unregister(_close_worker)
        atexit.register(_close_worker)
    return _WORKER[0]


_WARM = []


def _warm_up() -> None:
    """Compile a small breaking function once before forking, so that the lazy imports and
    one-time set-up of ember / torch.fx are inherited by the worker instead of repeated."""
    if _WARM:
        return
    _WARM.append(True)
    import ember
    from ember.testing import CompileCounter

    def warm(x, flag):
        y = x + 1
        with contextlib.redirect_stdout(io.StringIO()):
            print("warm")
        if y.sum() > 0:
            y = y * 2
        return y.relu() * flag

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for b in (CompileCounter(), "ember"):
                f = ember.compile(warm, backend=b)
                x = torch.randn(3, requires_grad=True)
                f(x, 2.0).sum().backward()
                f(torch.randn(4), 3)
    except Exception:  # noqa: BLE001 - the cases report ember's problems
        pass
    finally:
        torch.set_num_threads(threads)


def forks() -> bool:
    """Whether cases run in a forked worker. A CUDA build of torch starts autograd's device threads
    at the first backward of the process (pytest-xdist workers have run other tests' backward before
    these), and torch refuses autograd in a child forked after that: there the cases run inline, and
    xdist restarts a crashed worker. BREAKS_NO_FORK=1 asks for inline runs anywhere."""
    import os
    return not (os.environ.get("BREAKS_NO_FORK") or torch.version.cuda)


def run_case(c: Case) -> None:
    import os

    import ember  # noqa: F401 - imported before forking

    if not forks():
        problems = _run_case_inline(c)
    else:
        w = _worker()
        problems = w.run(c.name)
        if w.pid is None:  # crashed or hung: the next case forks a fresh worker
            _WORKER.clear()
    if problems:
        raise AssertionError(f"{c.name}:\n" + "\n".join(f"- {p}" for p in problems))


# ---- input factories shared by the case files ---------------------------------------------------
def t(n):
    """One (n, 3) tensor."""
    return (torch.randn(n, 3),)


def alt(n, i):
    """An (n, 3) tensor whose sign alternates with the call: both sides of a data-dependent branch run."""
    return (torch.randn(n, 3) * 0.1 + (1.0 if i % 2 == 0 else -1.0),)


def log_setup():
    """State reset for cases that append to a module-level LOG list."""
    return {"LOG": []}
