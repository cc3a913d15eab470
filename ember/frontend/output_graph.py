"""The graph under construction: FX graph, graph inputs, fake-tensor propagation, guards.

Every tensor operation the interpreter meets goes through ``OutputGraph.call``: it adds one FX node
and runs the same operation on FakeTensors to learn the result's metadata, so capture never computes
on real data and never touches real tensors.
"""
from __future__ import annotations

import builtins
import collections.abc
import contextlib
import keyword
import operator
import re
from typing import Any

import sympy
import torch
import torch.fx as fx
from torch._dispatch.python import enable_python_dispatcher
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic
from torch.utils import _pytree as pytree
from torch.utils._sympy.numbers import int_oo

from ember.frontend.dynamic import (
    Binding, ConstraintViolation, FrameShapeState, ShapeGuardPlan, dim_source, free_symbols, is_static_source,
    is_symbolic, new_shape_env, size_oblivious, symbolic_context,
)
from ember.config import config
from ember.frontend import trace_rules
from ember.frontend.fake_memo import FakeMemo
from ember.frontend.errors import Unsupported
from ember.frontend.size_one import holds_at_one
from ember.frontend.guards import GuardKind, GuardSet, TensorMeta, global_state
from ember.frontend.side_effects import SideEffects
from ember.frontend.sources import ConstSource, Source
from ember.frontend.variables.base import VariableTracker
from ember.frontend.variables.sequences import ListVariable, StructSeqVariable, TupleVariable
from ember.frontend.variables.symbolic import SymIntVariable, wrap_sym
from ember.frontend.variables.tensor import TensorVariable

# Torch calls that change process state: running them on fake tensors at trace time would leak the
# effect into the real program, so they are refused (a graph break once breaks exist).
_STATEFUL_TORCH = {
    "manual_seed", "seed", "initial_seed", "set_rng_state", "get_rng_state", "set_default_dtype",
    "set_default_device", "set_default_tensor_type", "use_deterministic_algorithms", "set_printoptions",
    "set_num_threads", "set_num_interop_threads", "save", "load", "synchronize", "set_flush_denormal",
}


def _changes_global_state(target) -> bool:
    """A torch call of _STATEFUL_TORCH, or a ``torch._C._set_*`` binding (the switches behind
    ``torch.backends.*.flags``, ``enable_flash_sdp``, ``torch.backends.mkldnn.enabled = ...``): run at
    trace time it switched the state the rest of the trace saw (the fake propagation of an SDPA call
    after ``enable_flash_sdp(False)`` gave the math kernel's strides) while the graph, which holds no
    such call, ran every op in the caller's state; a graph break runs it where eager does."""
    name = getattr(target, "__name__", None)
    mod = str(getattr(target, "__module__", ""))
    if not mod.startswith("torch") or not isinstance(name, str):
        return False
    return name in _STATEFUL_TORCH or (mod == "torch._C" and name.startswith("_set_"))


# Tensor methods whose result depends on tensor *data* (or leaves the graph's world).
_DATA_DEPENDENT_METHODS = {
    "item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__", "data_ptr",
    "backward", "register_hook", "retain_grad", "untyped_storage", "storage", "cpu_numpy",
}


def _sanitize(name: str) -> str:
    name = re.sub(r"[^0-9a-zA-Z_]+", "_", name).strip("_")
    if not name or name[0].isdigit():
        name = "v_" + name
    if name in _RESERVED:  # FX writes the placeholder's name into forward(self, ...) as it is
        name += "_1"
    return name


# names a placeholder must not take: GraphModule.forward's own ``self``, keywords, and every global
# the generated forward reads (builtins such as getattr, and FX's own: torch, inf, device...)
_RESERVED = frozenset({"self", *keyword.kwlist, *keyword.softkwlist, *vars(builtins), *fx.graph._custom_builtins})


class OutputGraph:
    def __init__(self, root_globals: dict | None = None, shapes: FrameShapeState | None = None) -> None:
        self.root_globals = root_globals
        self.graph = fx.Graph()
        # one ShapeEnv per trace: it holds the symbols of dynamic dimensions and what tracing assumed
        # of them (with no dynamic input it stays empty and every shape is a plain int)
        self.shapes = shapes if shapes is not None else FrameShapeState(False)
        self.shape_env = new_shape_env()
        self.fake_mode = FakeTensorMode(shape_env=self.shape_env)
        # the results of calls already propagated with the same metadata (a model's repeated layers)
        self.fake_memo = FakeMemo(self.fake_mode) if config.frontend_fake_memo else None
        self.sym_bindings: list[Binding] = []
        self._sym_ties: list = []
        self._sym_bounds: dict = {}  # symbol -> (min, max) from mark_dynamic
        self._marked: list = []      # (source name, dim, symbol expr, bounds): checked after tracing
        # held for the whole trace and backend compile (convert._compile): the size-oblivious switch,
        # entered at the first dimension traced size-obliviously (dynamic.FrameShapeState.oblivious_dims)
        self.scope = contextlib.ExitStack()
        self._oblivious = False
        self.oblivious_symbols: set = set()
        self.guards = GuardSet()
        self.guards.add(None, GuardKind.GLOBAL_STATE, global_state())
        # graph inputs, in placeholder order: (source, real value, placeholder node)
        self.inputs: list[tuple[Source, Any, fx.Node]] = []
        self._input_vt_by_id: dict[int, Any] = {}
        self._placeholder_names: set[str] = set()
        # objects the generated entry function refers to by name (globals dicts, the root callable...)
        self.namespace: dict[str, Any] = {}
        self.inlined: dict[int, Any] = {}  # id -> each Python function whose bytecode the trace ran (persist.py)
        # id(cell) -> (cell, its tracker, the cell's path): one tracker per closure cell object, so a
        # write through one function's closure is what another function sharing the cell reads
        self.real_cells: dict[int, tuple] = {}
        self._ns_by_id: dict[int, str] = {}
        # one tracker per source, so a value read twice is the same tracker (and guarded once)
        self.wrap_cache: dict = {}
        # sources whose nn.Modules (and every module reached through them) are guarded by their type
        # and structure, not their identity: a loop variable iterating identical blocks, the
        # ``self`` of a forward shared by identical modules (see ``module_by_structure``)
        self.structural_roots: frozenset = frozenset()

        self.side_effects = SideEffects()
        # np.random.seed values met before the graph's first draw: the entry runs them before the graph
        # (variables/numpy_random.py says why a seed is no graph node)
        self.seeds: list[int] = []

    # ---- the entry namespace ----------------------------------------------------------------
    def globals_ns(self, g: dict) -> str:
        name = self._ns_by_id.get(id(g))
        if name is None:
            name = "__g" if g is self.root_globals else f"__g{len(self.namespace)}"
            self.namespace[name] = g
            self._ns_by_id[id(g)] = name
        return name

    def object_source(self, obj, label: str):
        """A source for an object reached without a runtime path: the entry holds it by name."""
        name = self._ns_by_id.get(id(obj))
        if name is None:
            name = f"__obj{len(self.namespace)}_{_sanitize(label)[:30]}"
            self.namespace[name] = obj
            self._ns_by_id[id(obj)] = name
        return ConstSource(name, label)

    def module_by_structure(self, source: Source | None) -> bool:
        """Is a module at ``source`` guarded by structure (``structural_roots``), not identity?"""
        while source is not None and self.structural_roots:
            if source in self.structural_roots:
                return True
            source = source.base()
        return False

    # ---- inputs ----------------------------------------------------------------------------
    def add_tensor_input(self, value: torch.Tensor, source: Source):
        """Wrap a real tensor reached through ``source`` as a graph input (one placeholder per object)."""
        existing = self._input_vt_by_id.get(id(value))
        if existing is not None:
            if existing.source != source:
                self.guards.add(source, GuardKind.ALIAS, None, other=existing.source)
            return existing
        dims = self.shapes.tensor_dims(source.name(), value, is_static_source(source, value))
        oblivious = self.shapes.oblivious_dims(source.name(), value, dims) if dims else set()
        if oblivious:
            # the other symbolic dimensions of this tensor keep the usual rule: 0 and 1 specialize
            dims = {d: b for d, b in dims.items() if d in oblivious or value.shape[d] >= 2}
        if dims:
            with size_oblivious() if oblivious else contextlib.nullcontext():
                fake = self.fake_mode.from_tensor(value, symbolic_context=symbolic_context(value.dim(), dims),
                                                  source=dim_source(source.name()))
            if oblivious:
                self._oblivious_ranges(fake, dims, oblivious)
            meta = self._bind_sizes(source, value, fake, dims)
        else:
            fake = self.fake_mode.from_tensor(value, static_shapes=True)
            meta = TensorMeta.of(value)
        self.guards.add(source, GuardKind.TENSOR, meta)
        node = self._placeholder(source)
        node.meta["example_value"] = fake
        self.inputs.append((source, value, node))
        vt = TensorVariable(node, fake, source=source)
        self._input_vt_by_id[id(value)] = vt
        return vt

    def add_symint_input(self, value: int, source: Source):
        """An int argument traced as a symbol (dynamic=True, or it changed since the last compile);
        None when the ShapeEnv keeps it a constant (0 and 1 are specialized)."""

        sym = self.shape_env.create_unspecified_symint_and_symbol(value, dim_source(source.name()), DimDynamic.DYNAMIC)
        if not is_symbolic(sym):
            return None
        self.guards.add(source, GuardKind.TYPE, int)
        self.sym_bindings.append(Binding(source, "int", 0, sym.node.expr))
        node = self._placeholder(source)
        node.meta["example_value"] = sym
        self.inputs.append((source, value, node))
        return SymIntVariable(node, sym, source=source)

    def _oblivious_ranges(self, fake, dims: dict, oblivious: set) -> None:
        """A size-oblivious tensor's symbols start at [0, inf): its oblivious dimensions get [1, inf)
        (size 0 still recompiles), the others [2, inf) as usual. From here to the end of the compile
        torch's guard_or_false sites take their general branch for every symbol (``scope``)."""
        for d in dims:
            size = fake.shape[d]
            if is_symbolic(size) and isinstance(size.node.expr, sympy.Symbol):
                self.shape_env.constrain_symbol_range(size.node.expr, 1 if d in oblivious else 2, int_oo)
                if d in oblivious:
                    self.oblivious_symbols.add(size.node.expr)
        if not self._oblivious:
            self._oblivious = True
            self.scope.enter_context(size_oblivious())

    def check_size_one(self, gm: fx.GraphModule) -> str | None:
        """Before the backend compiles ``gm``: if the graph does not hold at size 1 of its oblivious
        symbols (size_one.py), their ranges start at 2 again, so the guard rejects 1. Returns why."""
        env = self.shape_env
        live = {env.replace(s) for s in self.oblivious_symbols}
        live = {s for s in live if isinstance(s, sympy.Symbol) and env.var_to_range[s].lower < 2}
        if not live:
            return None
        why = holds_at_one(gm, env, live)
        if why is not None:
            for s in live:
                env.constrain_symbol_range(s, 2, int_oo)
        return why

    def _bind_sizes(self, source: Source, value: torch.Tensor, fake, dims: dict) -> TensorMeta:
        """Record where each new symbol is read from; static positions stay in the tensor guard."""
        bound = {b.symbol for b in self.sym_bindings}
        shape, stride = [], []
        for kind, vals, out in (("size", fake.shape, shape), ("stride", fake.stride(), stride)):
            for i, v in enumerate(vals):
                if not is_symbolic(v):
                    out.append(int(v))
                    continue
                out.append(None)
                expr = v.node.expr
                if isinstance(expr, sympy.Symbol) and expr not in bound:
                    bound.add(expr)
                    self.sym_bindings.append(Binding(source, kind, i, expr))
                else:
                    self._sym_ties.append((source, kind, i, expr))
        for d, bounds in dims.items():
            expr = fake.shape[d].node.expr if is_symbolic(fake.shape[d]) else None
            if bounds is not None or d in getattr(value, "_ember_dynamic_dims", {}):
                self._marked.append((f"{source.name()}.size({d})", d, expr, bounds))
                if bounds is not None and isinstance(expr, sympy.Symbol):
                    self._sym_bounds[expr] = bounds
                    # the ShapeEnv's range too: backends read it (openvino bounds its dynamic dimensions)
                    self.shape_env.constrain_symbol_range(expr, -int_oo if bounds[0] is None else bounds[0],
                                                          int_oo if bounds[1] is None else bounds[1])
        return TensorMeta(type(value), value.dtype, value.device, tuple(shape), tuple(stride), value.requires_grad,
                          value.layout)

    def shape_guard(self) -> ShapeGuardPlan | None:
        """After the backend compiled the graph: check mark_dynamic constraints, then the SHAPE guard."""
        if not self.sym_bindings:
            return None
        env = self.shape_env
        for label, _dim, expr, bounds in self._marked:
            lo, hi = bounds if bounds is not None else (None, None)
            now = env.replacements.get(expr, expr) if expr is not None else None
            if now is None or not free_symbols(now):
                raise ConstraintViolation(
                    f"{label} was marked dynamic, but the compiled program only works for one size of it"
                    f"{'' if now is None else f' ({now})'}; remove the mark_dynamic call, or change the code "
                    "that depends on the exact size (EMBER_LOGS=guards shows the guards)")
            rng = env.var_to_range.get(now) if isinstance(now, sympy.Symbol) else None
            if rng is not None and ((lo is not None and rng.lower > max(lo, 2)) or
                                    (hi is not None and rng.upper < hi)):
                raise ConstraintViolation(
                    f"{label} was marked dynamic in [{lo}, {hi}], but the compiled program only works for "
                    f"sizes in [{rng.lower}, {rng.upper}]; narrow the bounds or change the code")
        return ShapeGuardPlan(env, self.sym_bindings, self._sym_ties, self._sym_bounds)

    def symbolic_dispatch(self):
        """With symbolic sizes, composite ops decompose through their Python (SymInt-aware)
        implementations: some C++ composites read plain sizes and would specialize every symbol."""
        return enable_python_dispatcher() if self.sym_bindings else contextlib.nullcontext()

    def _placeholder(self, source: Source) -> fx.Node:
        name = _sanitize(source.name())
        base, k = name, 1
        while name in self._placeholder_names:
            name = f"{base}_{k}"
            k += 1
        self._placeholder_names.add(name)
        # placeholders must precede every other node
        if self.inputs:
            with self.graph.inserting_after(self.inputs[-1][2]):
                node = self.graph.placeholder(name)
        else:
            first = next(iter(self.graph.nodes), None)
            if first is None:
                node = self.graph.placeholder(name)
            else:
                with self.graph.inserting_before(first):
                    node = self.graph.placeholder(name)
        node.meta["source"] = source.name()
        return node

    # ---- operations ------------------------------------------------------------------------
    def call(self, tx, kind: str, target, args: list, kwargs: dict):
        """Add ``target(*args, **kwargs)`` to the graph (kind: call_function or call_method)."""
        if kind == "call_method" and target in _DATA_DEPENDENT_METHODS:
            raise Unsupported(
                f"Tensor.{target}() needs the tensor's data, which is unknown while tracing",
                hint="keep the value as a tensor, or move this out of the compiled function")
        if kind == "call_function" and _changes_global_state(target):
            raise Unsupported(f"{target.__module__}.{target.__name__}() changes global state, which a graph cannot hold")
        flat = _flat_leaves(args, kwargs)
        node_args = _map_args(_to_node_arg, args, kwargs, flat)
        if (kind == "call_method" or str(getattr(target, "__module__", "")).startswith(("torch", "ember."))) and \
                _has_class(node_args) is not False:
            # a Python type where torch (or torch._numpy, behind ember's NumPy wrappers) takes a dtype
            # (x.to(bool), dtype=float, a.astype(int)): the graph's code cannot spell a class, and
            # torch reads them as these dtypes
            node_args = pytree.tree_map(lambda a: _PY_TYPE_DTYPES.get(a, a) if isinstance(a, type) else a, node_args)
        fake_args = _map_args(_to_fake_arg, args, kwargs, flat)
        if kind == "call_function" and trace_rules.bypasses_dispatcher(target) and any(
                isinstance(leaf, torch.Tensor) for leaf in pytree.tree_leaves(fake_args)):
            raise Unsupported(
                f"torch._C.{target.__name__}() works on a tensor's raw data outside the dispatcher: it "
                "cannot run on the fake tensors of a trace", hint="it runs eagerly (a graph break)")
        node = self.graph.create_node(kind, target, tuple(node_args[0]), node_args[1])
        node.meta["stack_trace"] = tx.user_location() if tx is not None else ""
        memo = self.fake_memo if not (self.sym_bindings or self._oblivious) else None
        key = memo.key(kind, target, fake_args) if memo is not None else None
        result = memo.replay(key, fake_args) if key is not None else None
        if result is None:
            versions = memo.before(fake_args) if key is not None and key not in memo.entries else None
            result = self._propagate(node, kind, target, fake_args)
            if versions is not None:
                memo.record(key, fake_args, versions, result)
        if (result.layout != torch.strided if type(result) is FakeTensor else
                any(isinstance(r, torch.Tensor) and r.layout != torch.strided for r in pytree.tree_leaves(result))):
            # a sparse (or mkldnn) result: the autograd layer and the backends handle strided tensors only
            self.graph.erase_node(node)
            name = target if isinstance(target, str) else getattr(target, "__name__", repr(target))
            raise Unsupported(f"{name} returns a non-strided tensor ({_layouts(result)}); ember compiles dense tensors only")
        if isinstance(result, FakeTensor):
            for vt in (*args, *kwargs.values()) if flat else pytree.tree_leaves((args, kwargs), is_leaf=_is_vt):
                if getattr(vt, "fake", None) is result:
                    # in-place ops (x.add_(), x += y, out=...) and no-op conversions return the same
                    # object: keep the identity (`y is x`) by returning the same tracker
                    node.meta["example_value"] = result
                    node.meta["ember_returns_input"] = True  # an effect on an input: never dead code
                    return vt
        if target in _OFFSET_READERS and isinstance(result, int):
            self._guard_storage_offsets(args[0])
        # (a user function put in the graph by allow_in_graph keeps its node whatever it returns:
        # eager runs it at every call, for its effects too)
        kept = _is_mutating(kind, target, node.kwargs) or \
            kind == "call_function" and trace_rules.is_allowed_in_graph(target)
        return self.wrap_result(node, result, mutating=kept)

    def _propagate(self, node: fx.Node, kind: str, target, fake_args):
        """Run the call on the fake tensors (erasing ``node`` where that fails)."""
        try:
            with self.fake_mode, self.symbolic_dispatch():
                if kind == "call_method":
                    self_arg, *rest = fake_args[0]
                    return getattr(self_arg, target)(*rest, **fake_args[1])
                return target(*fake_args[0], **fake_args[1])
        except Unsupported:
            self.graph.erase_node(node)
            raise
        except Exception as exc:
            self.graph.erase_node(node)
            raise _fake_error(kind, target, exc) from exc

    def _guard_storage_offsets(self, t) -> None:
        """A storage offset read while tracing became a constant, but the tensor guard leaves offsets
        free (a view at another offset reuses the graph, as in torch.compile): pin the offset of the
        input it comes from. An intermediate's offset derives from the inputs it views; which ones is
        not tracked, so all of them are pinned."""
        if getattr(t, "source", None) is not None:
            self.guards.add(t.source, GuardKind.STORAGE_OFFSET, t.fake.storage_offset())
            return
        for source, value, _ in self.inputs:
            if isinstance(value, torch.Tensor):
                self.guards.add(source, GuardKind.STORAGE_OFFSET, value.storage_offset())

    def wrap_result(self, node: fx.Node, result, mutating: bool = False):
        if isinstance(result, FakeTensor):
            node.meta["example_value"] = result
            return TensorVariable(node, result)
        if isinstance(result, (tuple, list)) and any(isinstance(r, torch.Tensor) for r in pytree.tree_leaves(result)):
            node.meta["example_value"] = result
            items = []
            for i, r in enumerate(result):
                item = self.graph.call_function(operator.getitem, (node, i))
                items.append(self.wrap_result(item, r))
            if isinstance(result, list):
                return ListVariable(items)
            if type(result) is not tuple and hasattr(type(result), "n_fields"):
                return StructSeqVariable(type(result), items)
            return TupleVariable(items)
        if isinstance(result, torch.Tensor):
            raise Unsupported(f"an operation returned a real tensor while tracing ({node.target})")
        if isinstance(result, torch.SymInt):  # x.numel(), torch.sym_max(...) of symbolic sizes

            return wrap_sym(None, node, result)
        if isinstance(result, collections.abc.Iterator) or \
                any(isinstance(r, torch.Tensor) for r in pytree.tree_leaves(result)):
            # an iterator (of fake tensors, for all the trace knows), or tensors inside a dict (or
            # another container the graph cannot index): as a constant the tracer's fake tensors
            # would reach the caller
            self.graph.erase_node(node)
            what = "an iterator" if isinstance(result, collections.abc.Iterator) else "tensors inside a"
            raise Unsupported(f"{getattr(node.target, '__name__', node.target)} returned {what} "
                              f"{type(result).__name__}, which a graph cannot describe")
        if not mutating and not node.users:
            self.graph.erase_node(node)
        return VariableTracker.const(result)

    def op_nodes(self) -> int:
        return sum(1 for n in self.graph.nodes if n.op in ("call_function", "call_method", "call_module"))

    def random_nodes(self) -> list[str]:
        """The names of the graph's nodes that draw random numbers so far."""
        return [n.name for n in self.graph.nodes if n.op in ("call_function", "call_method") and is_random_target(n.target)]


# ops drawing from the global generator (by name: torch functions, Tensor methods and F.* share them)
RANDOM_OPS = {"dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout",
              "rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm", "bernoulli",
              "multinomial", "normal", "poisson", "rrelu", "gumbel_softmax", "uniform_", "normal_",
              "bernoulli_", "exponential_", "geometric_", "log_normal_", "cauchy_", "random_"}


def is_random_target(target) -> bool:
    name = target if isinstance(target, str) else getattr(target, "__name__", "")
    return name in RANDOM_OPS or getattr(target, "ember_random", False)


# calls whose answer is a tensor's storage offset (which the tensor guard does not check)
_OFFSET_READERS = ("storage_offset", torch.Tensor.storage_offset)


def _layouts(result) -> str:
    return ", ".join(sorted({str(r.layout) for r in pytree.tree_leaves(result) if isinstance(r, torch.Tensor)}))


def _is_vt(x) -> bool:
    return isinstance(x, VariableTracker)


def _is_mutating(kind: str, target, kwargs=None) -> bool:
    # an out= call writes its out tensors: never dead code, though it may return None
    # (split_with_sizes_copy) or a tuple of them (torch.max(x, 1, out=(v, i)))
    if target is operator.setitem or (kwargs and kwargs.get("out") is not None):
        return True
    name = target if isinstance(target, str) else getattr(target, "__name__", "")
    return name.endswith("_") and not name.endswith("__")


_PY_TYPE_DTYPES = {bool: torch.bool, int: torch.int64, float: torch.float64, complex: torch.complex128}


# argument values pytree takes as leaves (no container among them), by exact type
_LEAF_TYPES = frozenset({int, float, bool, str, complex, type(None), type(Ellipsis), slice, torch.dtype, torch.device,
                         torch.layout, torch.memory_format, fx.Node})


def _flat_leaves(args: list, kwargs: dict) -> bool:
    """Is every argument a leaf for pytree (a tracker, or a plain value of ``_LEAF_TYPES``)? Then
    mapping over the arguments needs no pytree walk (most calls: the walk was ~5% of a trace)."""
    for v in (*args, *kwargs.values()):
        if not (type(v) in _LEAF_TYPES or isinstance(v, VariableTracker)):
            return False
    return True


def _map_args(fn, args: list, kwargs: dict, flat: bool):
    """``pytree.tree_map(fn, (args, kwargs), is_leaf=_is_vt)``, without the walk where ``flat``."""
    if flat:
        return [fn(v) for v in args], {k: fn(v) for k, v in kwargs.items()}
    return pytree.tree_map(fn, (args, kwargs), is_leaf=_is_vt)


def _has_class(obj) -> bool | None:
    """Does ``obj`` (node arguments) hold a class anywhere? None where it holds a container other
    than a list, tuple or dict (pytree's walk then decides)."""
    t = type(obj)
    if t in _LEAF_TYPES:
        return False
    if t is list or t is tuple or t is dict:
        for x in obj.values() if t is dict else obj:
            r = _has_class(x)
            if r is not False:
                return r
        return False
    return True if isinstance(obj, type) else None


def _to_node_arg(v):
    if isinstance(v, VariableTracker):
        return v.as_node_arg()
    return v


def _to_fake_arg(v):
    if isinstance(v, VariableTracker):
        return v.as_fake_arg()
    return v


def _fake_error(kind, target, exc: Exception) -> Unsupported:
    name = target if isinstance(target, str) else getattr(target, "__qualname__", repr(target))
    what = f"Tensor.{name}" if kind == "call_method" else name
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    cls = type(exc).__name__
    if "DataDependent" in cls or "DynamicOutputShape" in cls:
        return Unsupported(f"{what} depends on tensor data or has a data-dependent output shape ({cls})",
                           hint="keep the result as a tensor, or move this out of the compiled function")
    err = Unsupported(f"{what} failed while tracing with fake tensors: {cls}: {text}")
    err.user_error = exc  # the same call would fail eagerly too
    return err
