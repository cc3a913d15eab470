"""On-disk cache of the autograd layer's traced graphs: a warm start skips analysis and tracing.

Analysis (a functionalized fake run) and ``make_fx`` tracing are most of a warm start's work: for
GPT-2 inference on the H100 host they took 1.9 of its 2.9 s, the native backend's own cache having
removed code generation. A process that captures the same graph for inputs of the same description,
under the same global state, gets the same traced graphs; this cache keeps them, so the second
process only compiles them (which the backend's cache then answers too).

The key hashes everything the trace reads, and a graph the key cannot describe is not cached:

* the captured graph's nodes: op, name, target and arguments, what its generated code is made of
  (``graph_text``, of the graph as captured, before ``mask_simplify`` rewrites it; a graph it cannot
  spell exactly, by that code); every ``call_function`` target
  must come from torch or the Python standard operators (anything else, a user function allowed
  in the graph, a custom op, could change without the code changing), and ``get_attr`` tensors are
  hashed with their values;
* per input: tensor type (``Tensor``/``Parameter`` only), sizes, strides, storage offset, dtype,
  device, ``requires_grad``, leaf/view/inference status, and which inputs share storage; other inputs by
  type and ``repr`` (bools, ints, floats, strings, None only); symbolic graphs are not cached;
* global state: grad mode, inference mode, autocast per device type and its dtype and cache, the
  default dtype, deterministic algorithms, the scaled-dot-product-attention backends allowed, and
  the name and capability of every CUDA device an input is on;
* the layer's options: the decomposition table (functions from torch or ember only), the
  partitioner (ember's only), ``strict``;
* the torch version and the source of every ember module.

Entries (``aot/<hh>/<key>.pkl``) are pickles of plain data: graphs as node lists (ops by qualified
name, ``val`` metadata as size/stride/dtype/device descriptions, rebuilt as FakeTensors, constant
tensors as their raw bytes), each graph's nodes pickled apart beside a summary (code, constants,
placeholders, devices) and built only when something reads them (``deferred.py``), inside ``ember.diskcache``'s envelope (the key it was built for, a
SHA-256 of the pickle): a file that is not ours, a truncated or corrupt one, or one stored under
another key is a miss, rebuilt and replaced. Unpickling is restricted to an allow-list of plain
classes (``_allowed``): no pickle can name a function to call beyond pure operators and torch's
dtype/device/size constructors. A rebuilt graph whose code differs from the one stored is a miss.
``EMBER_AOT_CACHE=0`` turns the cache off.
"""
from __future__ import annotations

import builtins
import dataclasses
import enum
import functools
import hashlib
import io
import os
import pickle
import sys

import torch
import torch.fx as fx
from torch.fx.immutable_collections import immutable_dict, immutable_list

from ember import diskcache
from ember.aot.lazy_code import TextCodeGraphModule
from ember.config import config

# node metadata kept with a cached graph: what backends, the partitioner and dumps read
_NODE_META = ("val", "stack_trace", "ember_mutated_input", "ember_reinplaced")
_TRUSTED_MODULES = ("torch", "_operator", "operator", "builtins", "math")
_OP_NAMESPACES = ("aten", "prims")
STATS = {"hits": 0, "misses": 0, "stores": 0, "uncacheable": 0}


class NotCacheable(Exception):
    """Something the key cannot describe: the graph is traced as usual and not stored."""


# ------------------------------------------------------------------------------------------- key

@functools.lru_cache(maxsize=1)
def ember_fingerprint() -> str:
    """The torch version and the source of every ember module (editing ember invalidates entries)."""
    h = hashlib.sha256(torch.__version__.encode())
    diskcache.hash_sources(h, os.path.dirname(os.path.dirname(os.path.abspath(__file__))), recursive=True)
    return h.hexdigest()


def _trusted(fn) -> bool:
    if isinstance(fn, torch._ops.OpOverload):
        return fn.namespace in _OP_NAMESPACES
    if isinstance(fn, torch._ops.OpOverloadPacket):
        return fn._qualified_op_name.split("::")[0] in _OP_NAMESPACES
    mod = getattr(fn, "__module__", None) or ""
    return mod.split(".")[0] in _TRUSTED_MODULES


def _attr(gm, target: str):
    for name in target.split("."):
        gm = getattr(gm, name)
    return gm


def _describe_tensor(t: torch.Tensor, storages: dict) -> str:
    if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.layout != torch.strided:
        raise NotCacheable(f"a {type(t).__name__} input ({t.layout})")
    sid = storages.setdefault(t.untyped_storage().data_ptr(), len(storages))
    return (f"{type(t).__name__}{tuple(t.shape)}{t.stride()}+{t.storage_offset()}:{t.dtype}:{t.device}:"
            f"rg{int(t.requires_grad)}:leaf{int(t.is_leaf)}:view{int(t._is_view())}:inference{int(t.is_inference())}:"
            f"storage{sid}")


def _describe_value(v) -> str:
    if v is None or type(v) in (bool, int, float, str):
        return f"{type(v).__name__}:{v!r}"
    if isinstance(v, (tuple, list)) and all(x is None or type(x) in (bool, int, float, str) for x in v):
        return f"{type(v).__name__}:{v!r}"
    raise NotCacheable(f"an input of type {type(v).__name__}")


def _global_state(devices) -> list:
    state = [torch.is_grad_enabled(), torch.is_inference_mode_enabled(), torch.get_default_dtype(),
             torch.are_deterministic_algorithms_enabled(), torch.is_autocast_cache_enabled()]
    for dev in ("cpu", "cuda"):
        state.append((dev, torch.is_autocast_enabled(dev), torch.get_autocast_dtype(dev)))
    b = torch.backends.cuda
    state.append((b.flash_sdp_enabled(), b.mem_efficient_sdp_enabled(), b.math_sdp_enabled(), b.cudnn_sdp_enabled()))
    for dev in sorted(devices):
        if dev.startswith("cuda"):
            state.append((dev, torch.cuda.get_device_name(dev), torch.cuda.get_device_capability(dev)))
    return state


_OPTION_KEYS: dict = {}


def _options_key(opts) -> str:
    """The decomposition table, partitioner and strictness (memoized per options object)."""
    got = _OPTION_KEYS.get(id(opts))
    if got is not None and got[0] is opts:
        return got[1]
    from ember.aot.partition import default_partition, min_cut_partition
    if opts.partition_fn not in (min_cut_partition, default_partition):
        raise NotCacheable("a partitioner of the caller's own")
    lazy = getattr(opts.decompositions, "ember_key", None)  # ember's own table: by name (not built)
    entries = [f"ember table {lazy}"] if lazy else [f"{op}={_function_name(fn)}" for op, fn in opts.decompositions.items()]
    key = hashlib.sha256("\n".join(sorted(entries) + [opts.partition_fn.__name__, str(opts.strict)]).encode()).hexdigest()
    _OPTION_KEYS[id(opts)] = (opts, key)
    return key


def _function_name(fn) -> str:
    """A decomposition's qualified name; torch's and ember's only (their code is in the key)."""
    if isinstance(fn, functools.partial):
        return f"partial({_function_name(fn.func)}, {fn.args!r}, {fn.keywords!r})"
    mod = getattr(fn, "__module__", None) or ""
    if mod.split(".")[0] not in ("torch", "ember"):
        raise NotCacheable(f"a decomposition of the caller's own ({mod}.{getattr(fn, '__qualname__', fn)})")
    return f"{mod}.{getattr(fn, '__qualname__', type(fn).__name__)}"


def key_of(gm: fx.GraphModule, args: list, opts, text: str | None = None) -> str:
    """The cache key of tracing ``gm`` for ``args`` now; raises NotCacheable. ``text``: the graph's
    ``graph_text`` as captured (``pipeline.Captured``: before ``mask_simplify`` rewrote it), else
    ``gm``'s now."""
    if not config.aot_cache:
        raise NotCacheable("EMBER_AOT_CACHE is off")
    if torch._C._are_functorch_transforms_active():
        raise NotCacheable("a functorch transform is active")
    h = hashlib.sha256(ember_fingerprint().encode())
    h.update(_options_key(opts).encode())
    h.update((graph_text(gm) if text is None else text).encode())
    for n in gm.graph.nodes:
        if n.op == "call_function" and not _trusted(n.target):
            raise NotCacheable(f"the graph calls {getattr(n.target, '__module__', '?')}.{getattr(n.target, '__name__', n.target)}")
        if n.op == "call_module":
            raise NotCacheable("the graph calls a module")
        if n.op == "get_attr":
            t = _attr(gm, n.target)
            if not isinstance(t, torch.Tensor):
                raise NotCacheable(f"a {type(t).__name__} attribute")
            h.update(_describe_tensor(t, {}).encode())
            h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    describe_inputs(h, args)
    return h.hexdigest()


class _Unplain(Exception):
    """A node argument ``graph_text`` cannot spell exactly: the key hashes the generated code instead."""


# node arguments spelled by type and repr (repr is exact for these: floats round-trip, a string is quoted)
_PLAIN_ARGS = (int, float, bool, str, type(None), type(...), torch.dtype, torch.device, torch.layout,
               torch.memory_format)


_SEQUENCES = {tuple: "tuple", list: "list", immutable_list: "list", torch.Size: "Size"}


def _arg_text(a) -> str:
    if isinstance(a, fx.Node):
        return f"%{a.name}"
    t = type(a)
    if t in _PLAIN_ARGS:
        return f"{t.__name__}:{a!r}"
    if t in _SEQUENCES:
        return f"{_SEQUENCES[t]}({','.join(map(_arg_text, a))})"
    if t is dict or t is immutable_dict:
        if not all(type(k) is str for k in a):
            raise _Unplain("a dict with keys other than strings")
        return "{" + ",".join(f"{k!r}:{_arg_text(v)}" for k, v in a.items()) + "}"
    if t is slice:
        return f"slice({_arg_text(a.start)},{_arg_text(a.stop)},{_arg_text(a.step)})"
    raise _Unplain(t.__name__)


def _target_text(t) -> str:
    if isinstance(t, str):  # (call_method, get_attr, placeholder and output names)
        return repr(t)
    if isinstance(t, torch._ops.OpOverload):
        return f"op:{t.name()}"
    if isinstance(t, torch._ops.OpOverloadPacket):
        return f"packet:{t._qualified_op_name}"
    try:
        name = fx.node._get_qualified_name(t)  # (the name the generated code calls it by: torch.relu)
    except Exception:  # noqa: BLE001 - no name fx can give
        raise _Unplain(f"target {t!r}") from None
    if _found(name) is not t:  # (a function its name does not find again: not spelled by name)
        raise _Unplain(f"target {t!r}")
    return f"fn:{name}"


def _found(qualified: str):
    """The object ``qualified`` names, looked up from the longest module of it already imported."""
    parts = qualified.split(".")
    if len(parts) == 1:  # (fx names builtins bare: getattr)
        return getattr(builtins, qualified, None)
    for i in range(len(parts) - 1, 0, -1):
        obj = sys.modules.get(".".join(parts[:i]))
        if obj is not None:
            for part in parts[i:]:
                obj = getattr(obj, part, None)
            return obj
    return None


def graph_text(gm: fx.GraphModule) -> str:
    """What running ``gm`` does, as text for the key: per node its op, name, target and arguments;
    the Python code fx generates is a function of exactly these (and of a pytree codegen's specs:
    such graphs are keyed by their code). Generating that code for the key cost 0.05-0.09 s of a
    GPT-2 warm start (the frontend's graph, after ``mask_simplify`` rewrote it, has no stored text);
    this walk costs a few ms. A node argument or target it cannot spell exactly (an object of another
    type, a function not found again by its module and name) falls back to the generated code."""
    if type(gm.graph._codegen) is not fx.graph.CodeGen:
        return "code:" + gm.code
    try:
        parts = ["nodes:"]
        for n in gm.graph.nodes:
            parts.append(f"{n.op} {n.name} {_target_text(n.target)} {_arg_text(n.args)} {_arg_text(n.kwargs)}")
        return "\n".join(parts)
    except _Unplain:
        return "code:" + gm.code


_graph_text = graph_text  # (its earlier name)


def describe_inputs(h, args) -> None:
    """Feed ``h`` what a compiled graph depends on in its inputs (each tensor's metadata, which share
    storage, other values) and the global state its trace read; raises NotCacheable."""
    storages: dict = {}
    devices = set()
    for a in args:
        if isinstance(a, torch.Tensor):
            h.update(_describe_tensor(a, storages).encode())
            devices.add(str(a.device))
        else:
            h.update(_describe_value(a).encode())
        h.update(b"|")
    h.update(repr(_global_state(devices)).encode())


# ------------------------------------------------------------------------------ graphs as data

class _NodeRef:
    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name


# values pickled as themselves (no persistent id), answered by one set lookup: ``persistent_id`` runs
# for every object pickled (~300k for a 24-layer Llama's training graphs), mostly these
_PLAIN_TYPES = frozenset([int, float, bool, str, bytes, type(None), tuple, list, dict, slice, torch.Size, torch.dtype,
                          torch.device, torch.layout, torch.memory_format, immutable_list, immutable_dict])


class _Pickler(pickle.Pickler):
    """Nodes by name, ops by qualified name, FakeTensors by description, tensors as raw bytes."""

    def persistent_id(self, obj):
        if type(obj) in _PLAIN_TYPES:
            return None
        if isinstance(obj, fx.Node):
            return ("node", obj.name)
        if isinstance(obj, torch._ops.OpOverload):
            return ("op", obj.name())
        if isinstance(obj, torch._ops.OpOverloadPacket):
            return ("packet", obj._qualified_op_name)
        if isinstance(obj, torch.Tensor):
            from torch._subclasses.fake_tensor import FakeTensor
            if isinstance(obj, FakeTensor):
                return ("fake", tuple(obj.shape), tuple(obj.stride()), obj.storage_offset(), obj.dtype,
                        str(obj.device), obj.requires_grad)
            if type(obj) not in (torch.Tensor, torch.nn.Parameter) or obj.layout != torch.strided:
                raise NotCacheable(f"a {type(obj).__name__} in a graph")
            # (a tensor's own pickle goes through torch.load: never in a cache entry)
            data = obj.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
            return ("tensor", type(obj) is torch.nn.Parameter, tuple(obj.shape), tuple(obj.stride()), obj.dtype,
                    str(obj.device), obj.requires_grad, data)
        if isinstance(obj, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            raise NotCacheable("a symbolic value in a graph")
        return None


# What an entry may name when it is unpickled: plain data classes and pure functions, never a
# callable that reaches further (getattr, eval, attrgetter, methodcaller, torch.load, ...).
_PURE_OPERATORS = frozenset(
    "add sub mul truediv floordiv mod pow neg pos abs invert and_ or_ xor lshift rshift matmul eq ne lt le gt ge "
    "not_ truth getitem contains is_ is_not index".split())
_SAFE_BUILTINS = frozenset("slice set frozenset complex range tuple list dict int float bool str bytes".split())
_SAFE_GLOBALS = frozenset([
    ("collections", "OrderedDict"),
    ("torch.fx.graph", "CodeGen"), ("torch.fx.graph", "_PyTreeCodeGen"), ("torch.fx.graph", "_PyTreeInfo"),
    ("torch.fx.immutable_collections", "immutable_dict"), ("torch.fx.immutable_collections", "immutable_list"),
    ("torch.serialization", "_get_layout"),
    ("torch.utils._pytree", "TreeSpec"), ("torch.utils._pytree", "LeafSpec"),
])
_ENTRY_MODULES = ("ember.aot.",)  # whose dataclasses and enums an entry holds (meta, partition summaries)


def _allowed(module: str, name: str) -> bool:
    if module in ("operator", "_operator"):
        return name in _PURE_OPERATORS
    if module == "math":
        return not name.startswith("_")
    if module == "builtins":
        return name in _SAFE_BUILTINS
    if module == "torch._utils" and name.startswith("torch."):
        # a dtype, layout or memory format pickles by its qualified name, which pickle finds through
        # the first module holding it (``torch._utils``, which imports torch): ``torch.contiguous_format``
        module, name = "torch", name[len("torch."):]
    if module == "torch":
        obj = getattr(torch, name, None) if "." not in name else None
        return obj is torch.device or obj is torch.Size or isinstance(obj, (torch.dtype, torch.layout,
                                                                             torch.memory_format))
    if (module, name) in _SAFE_GLOBALS:
        return True
    if module.startswith(_ENTRY_MODULES) and "." not in name:
        import importlib
        obj = getattr(importlib.import_module(module), name, None)
        return isinstance(obj, type) and (dataclasses.is_dataclass(obj) or issubclass(obj, enum.Enum))
    return False


class _Restricted(pickle.Unpickler):
    """Resolves only what ``_allowed`` lists; persistent ids come back as they are (the store-time check)."""

    def find_class(self, module, name):
        if not _allowed(module, name):
            raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a cache entry")
        return super().find_class(module, name)

    def persistent_load(self, pid):
        return pid


class _Unpickler(_Restricted):
    def __init__(self, f, fake_mode):
        super().__init__(f)
        self.fake_mode = fake_mode

    def persistent_load(self, pid):
        kind = pid[0]
        if kind == "node":
            return _NodeRef(pid[1])
        if kind == "op":
            ns, rest = pid[1].split("::")
            name, _, overload = rest.partition(".")
            return getattr(getattr(getattr(torch.ops, ns), name), overload or "default")
        if kind == "packet":
            ns, name = pid[1].split("::")
            return getattr(getattr(torch.ops, ns), name)
        if kind == "fake":
            _, shape, stride, offset, dtype, device, requires_grad = pid
            t = _fake(self.fake_mode, shape, stride, offset, dtype, device)
            return t.requires_grad_(requires_grad) if requires_grad else t
        if kind == "tensor":
            _, param, shape, stride, dtype, device, requires_grad, data = pid
            flat = (torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype) if data
                    else torch.empty(0, dtype=dtype))
            t = torch.empty_strided(shape, stride, dtype=dtype).copy_(flat.view(shape)).to(device)
            return torch.nn.Parameter(t, requires_grad) if param else t.requires_grad_(requires_grad)
        raise pickle.UnpicklingError(f"unknown persistent id {kind!r}")


def _fake(fake_mode, shape, stride, offset, dtype, device):
    """A FakeTensor of this description, built around a meta tensor directly: through the fake
    mode's dispatch, the values of a cached GPT-2 graph took most of its load time."""
    from torch._subclasses.fake_tensor import FakeTensor
    if offset:
        span = 1 + sum((n - 1) * st for n, st in zip(shape, stride)) if all(shape) else 0
        meta = torch.empty(offset + span, dtype=dtype, device="meta").as_strided(shape, stride, offset)
    else:
        meta = torch.empty_strided(shape, stride, dtype=dtype, device="meta")
    return FakeTensor(fake_mode, meta, torch.device(device))


def graph_data(gm: fx.GraphModule) -> dict:
    """A graph module as plain data (taken before any compiler rewrites the graph in place): a summary
    with its nodes pickled apart, loaded as a ``deferred.DeferredGraphModule`` (nodes built when read)."""
    from ember.aot import deferred
    nodes = [(n.op, n.name, n.target, n.args, n.kwargs, {k: n.meta[k] for k in _NODE_META if k in n.meta})
             for n in gm.graph.nodes]
    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(dict(nodes=nodes, codegen=gm.graph._codegen))
    _Restricted(io.BytesIO(buf.getvalue())).load()  # (what could not load is not stored)
    return deferred.summary_of(gm, buf.getvalue())


def rebuild_nodes(data: dict, fake_mode=None) -> fx.Graph:
    """The fx.Graph of a stored graph's ``nodes`` and ``codegen`` (shared with the frontend cache); a
    summary's nodes (``graph_data``: pickled apart) are unpickled first, their values in ``fake_mode``."""
    if isinstance(data["nodes"], bytes):
        from torch._subclasses.fake_tensor import FakeTensorMode
        data = _Unpickler(io.BytesIO(data["nodes"]), fake_mode or FakeTensorMode(allow_non_fake_inputs=True)).load()
    g = fx.Graph()
    env: dict = {}

    def resolve(a):
        return env[a.name] if isinstance(a, _NodeRef) else a
    for op, name, target, args, kwargs, meta in data["nodes"]:
        node = g.create_node(op, target, fx.node.map_aggregate(args, resolve), fx.node.map_aggregate(kwargs, resolve),
                             name=name)
        node.meta.update(meta)
        env[name] = node
    g._codegen = data["codegen"]
    return g


class LoadedGraphModule(TextCodeGraphModule):
    """A graph module rebuilt from a cache entry, whose Python code is compiled only when it runs: a
    warm start whose compiled graphs come from the native cache never runs it (it is the fallback),
    and compiling GPT-2's forward and backward code took ~0.1-0.2 s of its first call. The code is
    generated at once and must be the stored text (``make_loaded``: else the entry is stale and is
    traced again); until the graph runs, ``code`` answers that checked text, which is what the
    caches downstream hash. ``recompile()`` (a pass changed the graph) forgets it.

    ``make_loaded(verify=False)``: the text is checked when ``code`` is first answered from it, not
    at load; a graph a pass changes first (the frontend's captured graph, whose attention masks
    ``aot.mask_simplify`` replaces) never pays for a check of text nothing reads."""

    _ember_unverified = False

    @classmethod
    def recompile(cls) -> None:  # (fx makes one class per instance: these are per graph module)
        cls._ember_unverified = False
        super().recompile()

    @property
    def code(self) -> str:
        cls = type(self)
        if cls._ember_code is not None and cls._ember_unverified and self._needs_recompile():
            if self.graph.python_code(root_module="self").src != cls._ember_code:
                raise ValueError("the rebuilt graph's code differs from the stored one (a stale cache entry)")
            cls._ember_unverified = False
        return super().code


def make_loaded(root, graph: fx.Graph, code: str, class_name: str = "GraphModule",
                verify: bool = True) -> fx.GraphModule:
    """A ``LoadedGraphModule`` of ``graph``, whose code must be ``code`` (else ValueError: a stale entry),
    checked now, or (``verify=False``) when ``code`` is first read from the stored text."""
    if verify and graph.python_code(root_module="self").src != code:
        raise ValueError("the rebuilt graph's code differs from the stored one")
    gm = LoadedGraphModule(root, graph, class_name=class_name)
    type(gm)._ember_code = code
    type(gm)._ember_unverified = not verify
    return gm


def rebuild_graph(data: dict, fake_mode=None) -> fx.GraphModule:
    """The graph module of a stored summary (``graph_data``), its nodes built when first read."""
    from ember.aot import deferred
    return deferred.load(data, fake_mode)


# ------------------------------------------------------------------------------------ the files

_KIND = "aot"


def _path(key: str) -> str:
    return os.path.join(config.cache_dir, "aot", key[:2], f"{key}.pkl")


def store(key: str, parts: dict, graphs=()) -> None:
    """Write ``parts`` (the entries named in ``graphs`` are graph modules, stored as data) atomically.
    Call it before any compiler rewrites the graphs in place. An entry that cannot be described, or
    whose pickle names something ``_allowed`` does not (it could not be loaded), is skipped (and
    logged): the traced graphs still compile."""
    buf = io.BytesIO()
    try:
        entry = {k: graph_data(v) if k in graphs else v for k, v in parts.items()}
        _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(entry)
        _Restricted(io.BytesIO(buf.getvalue())).load()
    except Exception as e:  # noqa: BLE001 - NotCacheable, an unpicklable value, an odd graph
        STATS["uncacheable"] += 1
        _log(f"ember aot cache: not storing {key[:16]}: {type(e).__name__}: {e}")
        return
    if diskcache.write_entry(_path(key), config.cache_dir, _KIND, key, buf.getvalue()):
        STATS["stores"] += 1


def load(key: str, fake_mode, graphs=()) -> dict | None:
    """The entry stored under ``key``, its ``graphs`` rebuilt as graph modules, or None. A missing,
    foreign, corrupt, swapped or stale entry (a graph that no longer rebuilds to its stored code) is
    a miss: logged once per cause (``ember.diskcache``) and traced again, never trusted."""
    path = _path(key)
    payload = None
    if diskcache.secure_dir(os.path.dirname(path), config.cache_dir, create=False):
        payload = diskcache.read_entry(path, _KIND, key)
    if payload is None:
        STATS["misses"] += 1
        return None
    try:
        entry = _Unpickler(io.BytesIO(payload), fake_mode).load()
        if not isinstance(entry, dict) or not isinstance(entry.get("meta"), _entry_meta_type()):
            raise pickle.UnpicklingError("not a traced-graphs entry")
        entry = {k: rebuild_graph(v, fake_mode) if k in graphs else v for k, v in entry.items()}
    except Exception as e:  # noqa: BLE001 - a class outside the allow-list, a stale graph: trace again
        diskcache.warn_once("ignoring aot entry", path, f"{type(e).__name__}: {e}", "it is traced again and replaced")
        STATS["misses"] += 1
        return None
    STATS["hits"] += 1
    return entry


def stale(key: str, error: Exception) -> None:
    """A loaded entry whose deferred graph did not rebuild (``deferred.StaleCacheEntry``): counted as
    a miss, said once, traced again and replaced."""
    STATS["hits"] -= 1
    STATS["misses"] += 1
    diskcache.warn_once("ignoring aot entry", _path(key), str(error), "it is traced again and replaced")


def _entry_meta_type():
    from ember.aot.analysis import GraphMeta
    return GraphMeta


def _log(msg: str) -> None:
    from ember.diagnostics import logging as elog
    elog.get_logger("graph_breaks").info(msg)
