"""The persisted frontend cache: a warm process installs a cache entry from disk instead of tracing.

A cold process traces a callable's bytecode into a graph, guards and a generated entry function
(``convert.py``). A later process compiling the same code in the same environment would trace the
same thing again: this cache stores, per entry, the entry function's source, the captured graph (as
data) and a *recipe* for every object the entry's namespace holds, and installs it in a warm process
after re-finding those objects. The backend is then called on the stored graph, where the autograd
layer's cache (``aot/cache.py``) and the native backend's (``native/cache.py``) answer, so the whole
first call is bound by loading.

Safety (the entry is code ember will run, and a wrong entry is a silent wrong result):

* **Key.** Everything the trace could depend on before any guard: ember's sources and torch's,
  Python's and the platform's versions, every ``ember.config`` field, the ``EMBER_*``/``TRITON_*``
  variables, the backend's name and bound options, ``fullgraph``/``dynamic``, the tracer's rule
  tables (``allow_in_graph``, ``disable``, polyfills), the stance, and the root callable: its code
  (bytes, constants, names, recursively; file, line and qualified name too), defaults, and closure
  cells (the kind of each content, and the value of a literal one); for a module, its class.
* **Objects re-found, never trusted by name alone.** A module or a module's globals: from
  ``sys.modules`` (never imported by the cache). A class or function: by module and qualified name,
  and a function's code, defaults and closure kinds must hash to what was recorded. An object the
  trace guarded by identity (a submodule, a closure's function): re-read from the live arguments
  through the guard's own path, and its type (and, for a function, its code) checked. Every function
  whose bytecode the trace inlined is re-found the same way and its code compared: a library
  upgrade or a monkey-patched method is a miss.
* **Guards re-run.** The installed entry is the stored entry function, which checks every guard on
  the live inputs (values, tensor metadata, identities of what was just re-found); a call it
  rejects compiles normally.
* **Not stored when in doubt:** graph breaks, symbolic (dynamic) graphs, a guard filter, a graph
  calling anything but torch/operator/math, a namespace object no recipe describes, a backend that
  is not a registered one with plain options. Each is a debug line of the ``ember.cache`` logger.
* **On disk:** ``ember.diskcache``'s rules (directories 0700 and ours, files ours, an envelope with
  the key, a checksum and a length); the payload unpickles through an allow-list (``aot/cache.py``'s
  ``_allowed`` plus the recipes' plain tuples). A refused or broken entry is one log line, then a
  normal compile that replaces it.
* A key stored by this process is not loaded by it (the in-memory caches serve it; tests that count
  compiles see every compile).

``EMBER_FRONTEND_CACHE=0`` (``config.frontend_cache``) turns it off.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import pickle
import platform
import sys
import types

import torch
import torch.fx as fx

from ember import diskcache
from ember.config import config
from ember.diagnostics import counters

_KIND = "frontend"
_VERSION = 1
_MAX_ENTRIES = 8  # per key: entries for different guards (shapes, dtypes) of the same callable
STATS = {"hits": 0, "misses": 0, "stores": 0, "uncacheable": 0, "rejected": 0}
_STORED_HERE: set = set()
# ember's own namespace values, bound again at install time (convert._finish sets them)
_EMBER_NAMES = ("__MISS", "__global_state", "__new_object", "__graph", "__root_self", "__ember_gs_grad",
                "__ember_gs_any_autocast", "__ember_gs_autocast", "__ember_gs_default_dtype")  # (last four: GLOBAL_STATE_NS)
_TRUSTED_GRAPH_MODULES = ("torch", "_operator", "operator", "builtins", "math")


class NotPersistable(Exception):
    """Something a recipe or the key cannot describe: the entry is not stored."""


class Doubt(Exception):
    """A stored entry that does not fit this process: the call compiles normally."""


# ------------------------------------------------------------------------------------ fingerprints

_CODE_HASHES: dict = {}


def code_hash(code: types.CodeType) -> str:
    """Everything of a code object that decides what it does, nested code objects included."""
    got = _CODE_HASHES.get(code)
    if got is not None:
        return got
    h = hashlib.sha256()
    for part in (code.co_code, code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars,
                 code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount, code.co_flags,
                 code.co_filename, code.co_firstlineno, getattr(code, "co_qualname", code.co_name),
                 getattr(code, "co_exceptiontable", b"")):
        h.update(repr(part).encode() + b"\0")
    for c in code.co_consts:
        h.update(code_hash(c).encode() if isinstance(c, types.CodeType) else f"{type(c).__name__}:{c!r}".encode())
        h.update(b"\1")
    _CODE_HASHES[code] = got = h.hexdigest()
    return got


def _value_kind(v) -> str:
    """A closure cell's or default's content: literal values in full, other objects by type."""
    if v is None or type(v) in (bool, int, float, str, bytes):
        return f"{type(v).__name__}:{v!r}"
    if isinstance(v, tuple) and all(x is None or type(x) in (bool, int, float, str) for x in v):
        return f"tuple:{v!r}"
    if isinstance(v, types.FunctionType):
        return f"function:{code_hash(v.__code__)}"
    return f"{type(v).__module__}.{type(v).__qualname__}"


def fn_fingerprint(fn) -> str:
    """A Python function's code, defaults and closure (content kinds, literal values)."""
    parts = [code_hash(fn.__code__), repr([_value_kind(d) for d in fn.__defaults__ or ()]),
             repr(sorted((k, _value_kind(v)) for k, v in (fn.__kwdefaults__ or {}).items()))]
    for cell in fn.__closure__ or ():
        try:
            parts.append(_value_kind(cell.cell_contents))
        except ValueError:
            parts.append("<empty cell>")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _fingerprint(obj) -> str | None:
    if isinstance(obj, types.FunctionType):
        return fn_fingerprint(obj)
    if isinstance(obj, types.MethodType) and isinstance(obj.__func__, types.FunctionType):
        return "method:" + fn_fingerprint(obj.__func__)
    return None


# ------------------------------------------------------------------------------------------ the key

_ENV_PREFIXES = ("EMBER_", "TRITON_", "CUDA_VISIBLE_DEVICES", "PYTORCH_", "TORCH_")
_FINGERPRINT: list = []
# settings that change what is logged or reported, never what a compile produces
_NOT_KEYED = ("logs", "verify", "run_stats")
_NOT_KEYED_ENV = tuple("EMBER_" + n.upper() for n in _NOT_KEYED)


def _environment() -> str:
    if not _FINGERPRINT:
        from ember.aot.cache import ember_fingerprint  # (ember's sources and torch's version)
        _FINGERPRINT.append(ember_fingerprint())
    from ember.config import environment
    env = [(k, v) for k, v in environment.with_prefixes(_ENV_PREFIXES) if k not in _NOT_KEYED_ENV]
    cfg = sorted((f.name, repr(getattr(config, f.name))) for f in dataclasses.fields(config)
                 if f.name not in _NOT_KEYED)
    return repr((_VERSION, _FINGERPRINT[0], torch.__version__, sys.version, platform.machine(), platform.system(),
                 env, cfg))


def _rules() -> str:
    from ember.frontend import trace_rules as tr
    out = []
    for table in ("ALLOWED_IN_GRAPH", "POLYFILLS", "DISABLED", "FORBIDDEN"):
        for k, v in getattr(tr, table).items():
            k = k[0] if isinstance(k, tuple) else k
            out.append(f"{table}:{_describe_callable(k)}:{type(v).__name__}")
    return repr(sorted(out))


def _describe_callable(fn) -> str:
    fp = _fingerprint(fn)
    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"
    return f"{name}:{fp}" if fp else name


def _backend_key(backend) -> str:
    """The backend's name and everything bound into it: partials' arguments, and the closures of the
    wrappers around it (``ember.compile``'s regional and DDP wrappers keep the bound mode and
    options there). The frontend's output does not depend on the backend (the stored graph is
    compiled again by the live one), but an entry made for other settings is not reused."""
    if getattr(backend, "ember_backend_name", None) is None:
        raise NotPersistable("a backend that is not a registered one")
    parts: list = [backend.ember_backend_name]
    _describe_backend(backend, parts, 0)
    return repr(parts)


def _describe_backend(b, parts: list, depth: int) -> None:
    import functools
    if depth > 8:
        raise NotPersistable("a backend wrapped too deeply to describe")
    if isinstance(b, functools.partial):
        parts.append("partial")
        _describe_backend(b.func, parts, depth + 1)
        for v in (*b.args, *b.keywords.values()):
            _describe_backend(v, parts, depth + 1)
        parts.append(sorted(b.keywords))
    elif _plain(b):
        parts.append(repr(b))
    elif isinstance(b, types.FunctionType):
        parts.append(f"{b.__module__}.{b.__qualname__}:{code_hash(b.__code__)}")
        for cell in b.__closure__ or ():
            try:
                v = cell.cell_contents
            except ValueError:
                continue
            _describe_backend(v, parts, depth + 1)
    elif isinstance(b, (type, types.BuiltinFunctionType, types.ModuleType)):
        parts.append(f"{getattr(b, '__module__', '')}.{getattr(b, '__qualname__', b.__name__)}")
    else:  # an object: its type (ember's own caches of compiled parts hold no settings of their own)
        parts.append(f"<{type(b).__module__}.{type(b).__qualname__}>")


def _plain(v) -> bool:
    if v is None or type(v) in (bool, int, float, str):
        return True
    if isinstance(v, (tuple, list)):
        return all(_plain(x) for x in v)
    if isinstance(v, dict):
        return all(type(k) is str and _plain(x) for k, x in v.items())
    return False


def key_of(cache) -> str:
    """The key of a FrameCache's compiles in this process; raises NotPersistable."""
    if not config.frontend_cache:
        raise NotPersistable("EMBER_FRONTEND_CACHE is off")
    if cache.guard_filter_fn is not None:
        raise NotPersistable("a guard_filter_fn")
    root = cache.root
    if root.kind not in ("function", "method", "module") or not isinstance(root.fn, types.FunctionType):
        raise NotPersistable(f"a {root.kind} root ({type(root.fn).__name__})")
    h = hashlib.sha256(_environment().encode())
    h.update(repr((root.kind, root.name, cache.fullgraph, cache.dynamic, cache.recompile_limit)).encode())
    h.update(_backend_key(cache.backend).encode())
    h.update(_rules().encode())
    h.update(fn_fingerprint(root.fn).encode())
    if root.self_obj is not None:
        t = type(root.self_obj)
        h.update(f"{t.__module__}.{t.__qualname__}".encode())
    return h.hexdigest()


# ------------------------------------------------------------------------------------------ recipes

def _resolve(module: str, qualname: str):
    """``module.qualname`` among the modules already imported (never imports); raises Doubt."""
    mod = sys.modules.get(module)
    if mod is None:
        raise Doubt(f"module {module} is not imported")
    obj = mod
    for part in qualname.split("."):
        if part == "<locals>":
            raise Doubt(f"{module}.{qualname} is local to a function")
        obj = getattr(obj, part, _NONE)
        if obj is _NONE:
            raise Doubt(f"{module}.{qualname} not found")
    return obj


_NONE = object()
_UNWRAP = ("fget", "fset", "__func__")


# where torch's C functions live under a name that finds them (their __module__/__qualname__ often do not)
_C_HOMES = ("torch", "torch.nn.functional", "torch._C._nn", "torch._C._VariableFunctions", "torch._C._fft",
            "torch._C._linalg", "torch._C._special", "torch.special", "torch.linalg", "torch.fft", "operator",
            "math", "builtins")


def _named(obj):
    """A recipe that finds ``obj`` by module and qualified name, or None."""
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    try:
        if isinstance(module, str) and isinstance(qualname, str):
            found = _resolve(module, qualname)
            if found is obj:
                return ("named", module, qualname, _fingerprint(obj))
            for part in _UNWRAP:  # a property's getter, a classmethod's function
                if getattr(found, part, None) is obj and isinstance(found, (property, types.MethodType)):
                    return ("named", module, qualname, _fingerprint(obj), part)
    except Doubt:
        pass
    if isinstance(obj, type):  # the interpreter's own types: types.FunctionType is builtins' "function"
        for k, v in vars(types).items():
            if v is obj:
                return ("named", "types", k, None)
    name = getattr(obj, "__name__", None)
    if isinstance(name, str):
        for home in _C_HOMES:
            if getattr(sys.modules.get(home), name, None) is obj:
                return ("named", home, name, None)
        owner = getattr(obj, "__objclass__", None)  # a method descriptor: torch.Tensor.add
        if owner is torch.Tensor or owner is torch._C.TensorBase:
            for cls in (torch.Tensor, torch._C.TensorBase):
                if cls.__dict__.get(name) is obj:
                    return ("named", cls.__module__, f"{cls.__qualname__}.{name}", None)
    return None


def _literal(v) -> bool:
    if v is None or type(v) in (bool, int, float, str, bytes, torch.dtype, torch.device, torch.layout, torch.Size):
        return True
    if type(v) in (tuple, frozenset):
        return all(_literal(x) for x in v)
    return False


def recipe_of(value, at: dict, homes: dict | None = None):
    """How a warm process finds ``value`` again; ``at``: id(object) -> the expression of a guard
    source that read it. Raises NotPersistable."""
    if _literal(value):
        return ("lit", value)
    if isinstance(value, types.ModuleType):
        if sys.modules.get(value.__name__) is not value:
            raise NotPersistable(f"module {value.__name__} not in sys.modules")
        return ("module", value.__name__)
    if type(value) is dict and isinstance(value.get("__name__"), str) and \
            getattr(sys.modules.get(value["__name__"]), "__dict__", None) is value:
        return ("globals", value["__name__"])
    if isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType)):
        got = _named(value)
        if got is not None:
            return got
    if isinstance(value, __import__("enum").Enum):
        cls = _named(type(value))
        if cls is not None:
            return ("member", cls, value.name)
    home = homes.get(id(value)) if homes is not None else None
    if home is not None:
        return ("attr", home[0], home[1], _named(type(value)))
    expr = at.get(id(value))
    if expr is not None:
        t = _named(type(value))
        if t is None:
            raise NotPersistable(f"an object of the local class {type(value).__qualname__}")
        return ("at", expr, t, _fingerprint(value))
    raise NotPersistable(f"a {type(value).__module__}.{type(value).__qualname__} the entry holds "
                         f"({diskcache_short(value)})")


def find_homes(modules) -> dict:
    """id(object) -> (recipe of its owner, attribute name) for the attributes of ``modules`` and of
    the classes they define: where an object the trace reached without a path (a class's registry
    dict) is found again."""
    homes: dict = {}
    for mod in modules:
        if not isinstance(mod, types.ModuleType) or sys.modules.get(mod.__name__) is not mod:
            continue
        for name, v in list(vars(mod).items()):
            homes.setdefault(id(v), (("module", mod.__name__), name))
            if isinstance(v, type) and v.__module__ == mod.__name__:
                owner = _named(v)
                if owner is not None:
                    for attr, w in list(vars(v).items()):
                        homes.setdefault(id(w), (owner, attr))
    return homes


def diskcache_short(v) -> str:
    r = repr(v)
    return r if len(r) < 50 else r[:47] + "..."


def _cook(recipe, ns: dict, local_values: dict):
    """The object ``recipe`` names in this process; raises Doubt."""
    kind = recipe[0]
    if kind == "lit":
        return recipe[1]
    if kind == "module":
        mod = sys.modules.get(recipe[1])
        if mod is None:
            raise Doubt(f"module {recipe[1]} is not imported")
        return mod
    if kind == "globals":
        return _cook(("module", recipe[1]), ns, local_values).__dict__
    if kind == "named":
        module, qualname, fp = recipe[1:4]
        obj = _resolve(module, qualname)
        if len(recipe) > 4:
            if recipe[4] not in _UNWRAP or not isinstance(obj, (property, types.MethodType)):
                raise Doubt(f"{module}.{qualname} is not a property or a class method now")
            obj = getattr(obj, recipe[4])
        if _fingerprint(obj) != fp:
            raise Doubt(f"{module}.{qualname} changed (code, defaults or closure)")
        return obj
    if kind == "member":
        cls = _cook(recipe[1], ns, local_values)
        obj = cls.__members__.get(recipe[2]) if hasattr(cls, "__members__") else None
        if obj is None:
            raise Doubt(f"{cls.__qualname__}.{recipe[2]} is gone")
        return obj
    if kind == "attr":
        _, owner, name, type_recipe = recipe
        obj = getattr(_cook(owner, ns, local_values), name, _NONE)
        if obj is _NONE or type_recipe is None or type(obj) is not _cook(type_recipe, ns, local_values):
            raise Doubt(f"attribute {name} is gone or of another type")
        return obj
    if kind == "at":
        _, expr, type_recipe, fp = recipe
        try:
            obj = eval(_expr_code(expr), ns, dict(local_values))  # noqa: S307 - a guard source's expression, from an entry we trust
        except Exception as e:  # noqa: BLE001 - the path does not resolve on these arguments
            raise Doubt(f"{expr} cannot be read ({type(e).__name__})") from None
        if type(obj) is not _cook(type_recipe, ns, local_values):
            raise Doubt(f"{expr} is a {type(obj).__qualname__} now")
        if _fingerprint(obj) != fp:
            raise Doubt(f"{expr} changed (code, defaults or closure)")
        return obj
    raise Doubt(f"unknown recipe {kind!r}")


# --------------------------------------------------------------------------------- graphs as data

def _graph_pickler():
    from ember.aot.cache import _PLAIN_TYPES, _Pickler

    class GraphPickler(_Pickler):
        def persistent_id(self, obj):
            if type(obj) in _PLAIN_TYPES:
                return None
            if isinstance(obj, (types.FunctionType, types.BuiltinFunctionType, types.MethodDescriptorType,
                                types.WrapperDescriptorType, types.BuiltinMethodType)) or \
                    (isinstance(obj, type) and not issubclass(obj, BaseException)):
                got = _named(obj)
                if got is None or got[1].split(".")[0] not in _TRUSTED_GRAPH_MODULES:
                    raise NotPersistable(f"the graph holds {getattr(obj, '__module__', '?')}."
                                         f"{getattr(obj, '__qualname__', obj)}")
                return ("callable", got[1], got[2], got[3])
            return super().persistent_id(obj)
    return GraphPickler


def _graph_unpickler(check_only: bool = False):
    """The unpickler of stored records; ``check_only``: one that resolves every class and callable a
    load would (what cannot load is not stored) but leaves graph values as their descriptions: the
    store-time check built a FakeTensor per node value (~1500 for a 24-layer Llama's graph)."""
    from ember.aot.cache import _allowed, _Restricted, _Unpickler

    class GraphUnpickler(_Restricted if check_only else _Unpickler):
        def find_class(self, module, name):
            if module == "ember.frontend.persist" or _allowed(module, name) or \
                    (module, name) in (("builtins", "Ellipsis"),):  # x[..., :n] in a graph's arguments
                return pickle.Unpickler.find_class(self, module, name)
            raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a frontend cache entry")

        def persistent_load(self, pid):
            if pid[0] == "callable":
                _, module, qualname, fp = pid
                if module.split(".")[0] not in _TRUSTED_GRAPH_MODULES:
                    raise pickle.UnpicklingError(f"{module} is not trusted in a graph")
                return _cook(("named", module, qualname, fp), {}, {})
            return super().persistent_load(pid)

        if check_only:
            def __init__(self, f, fake_mode=None):
                super().__init__(f)
    return GraphUnpickler


def graph_data(gm: fx.GraphModule) -> dict:
    nodes = []
    for n in gm.graph.nodes:
        if n.op == "call_module":
            raise NotPersistable("the graph calls a submodule")
        meta = {k: v for k, v in n.meta.items() if k in _NODE_META}
        nodes.append((n.op, n.name, n.target, n.args, n.kwargs, meta))
    from ember.aot.cache import _attr
    attrs = {n.target: _attr(gm, n.target) for n in gm.graph.nodes if n.op == "get_attr"}
    return dict(nodes=nodes, attrs=attrs, codegen=gm.graph._codegen, class_name=type(gm).__name__, code=gm.code)


_NODE_META = ("example_value", "val", "source", "stack_trace", "ember_module_calls", "ember_returns_input")


def rebuild_graph(data: dict) -> fx.GraphModule:
    from ember.aot.cache import make_loaded, rebuild_nodes
    from ember.frontend.convert import _ParamHolder
    g = rebuild_nodes(data)
    holder = _ParamHolder()
    for target, value in data["attrs"].items():
        if "." in target:
            raise Doubt("a dotted graph attribute")
        holder.register_buffer(target, value) if isinstance(value, torch.Tensor) else setattr(holder, target, value)
    # its code is checked when first read from the stored text, compiled when a call runs it
    # (aot.cache.LoadedGraphModule): the autograd layer usually rewrites it first (attention masks),
    # and reads the new code; a stale text met there raises, and that graph is traced without a key
    return make_loaded(holder, g, data["code"], class_name=data["class_name"], verify=False)


# ------------------------------------------------------------------------------------- store/load

def _path(key: str) -> str:
    return os.path.join(config.cache_dir, "frontend", key[:2], f"{key}.pkl")


def _note(msg: str) -> None:
    """Why an entry was not stored or not used: a debug line of the ``ember.cache`` logger (an
    uncacheable entry is not a problem; a refused file is a warning, from ``ember.diskcache``)."""
    diskcache.log.debug(msg)


def record_of(entry, graph_data_, inputs, inlined, guards, guards_source, root_fn=None) -> dict:
    """The stored form of a freshly compiled entry; raises NotPersistable."""
    from ember.frontend.guards import GuardKind
    if entry.breaks or entry.failure is not None:
        raise NotPersistable("an entry with a graph break" if entry.breaks else "a backend failure")
    at, code_at = {}, {}
    for g in guards:
        if g.kind is GuardKind.SHAPE:
            raise NotPersistable("symbolic sizes (dynamic shapes)")
        if g.kind is GuardKind.ID and g.source is not None:
            at.setdefault(id(g.expected), g.source.expr())
            if isinstance(g.expected, types.CodeType) and getattr(g.source, "attr", None) == "__code__":
                # a nested function guarded by its code, not its identity (variables/functions.py):
                # found where that code was read from
                code_at.setdefault(id(g.expected), g.source.base().expr())
    ns = {}
    homes = None
    for name, value in entry.namespace.items():
        if name in _EMBER_NAMES or name in ("__builtins__", entry.build_args["name"]):
            continue
        if value is root_fn and root_fn is not None:  # the key holds its code, defaults and closure
            ns[name] = ("root",)
            continue
        if name.startswith("__default_"):
            ns[name] = ("default", name[len("__default_"):])
            continue
        try:
            ns[name] = recipe_of(value, at)
        except NotPersistable:
            if homes is None:
                homes = find_homes({sys.modules.get(getattr(f, "__module__", None) or "") for f in inlined})
            ns[name] = recipe_of(value, at, homes)
    funcs = []
    for fn in inlined:
        if fn is root_fn:
            continue
        got = _named(fn)
        where = at.get(id(fn)) or code_at.get(id(fn.__code__))
        if got is None and where is not None:
            t = _named(type(fn))
            got = ("at", where, t, fn_fingerprint(fn)) if t is not None else None
        if got is None:
            raise NotPersistable(f"inlined function {fn.__qualname__} cannot be found again by name or guard")
        funcs.append(got)
    return dict(version=_VERSION, name=entry.build_args["name"], source=entry.source, guards_source=guards_source,
                ns=ns, funcs=funcs,
                inputs=inputs, graph=graph_data_, op_count=entry.op_count, params=entry.params,
                has_graph=entry.graph is not None)


def store(key: str, record: dict) -> None:
    """Add ``record`` to the entries stored under ``key`` (newest first, at most _MAX_ENTRIES). The
    file holds each record pickled on its own, so older ones are kept as the bytes they were."""
    _STORED_HERE.add(key)
    buf = io.BytesIO()
    try:
        _graph_pickler()(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(record)
        _graph_unpickler(check_only=True)(io.BytesIO(buf.getvalue())).load()  # what cannot load is not stored
    except Exception as e:  # noqa: BLE001 - NotPersistable, an unpicklable value
        STATS["uncacheable"] += 1
        _note(f"ember frontend cache: not storing an entry of {record['name']}: {type(e).__name__}: {e}")
        return
    blobs = [buf.getvalue(), *(_read_blobs(key, quiet=True) or [])][:_MAX_ENTRIES]
    if diskcache.write_entry(_path(key), config.cache_dir, _KIND, key, pickle.dumps(blobs)):
        STATS["stores"] += 1
        for text in (record["guards_source"], record["source"]):  # the code objects a warm start executes
            _entry_code(record["name"], text)
        _store_exprs(record)


def _read_blobs(key: str, quiet: bool = False):
    path = _path(key)
    if not diskcache.secure_dir(os.path.dirname(path), config.cache_dir, create=False):
        return None
    payload = diskcache.read_entry(path, _KIND, key)
    if payload is None:
        return None
    try:
        from ember.aot.cache import _Restricted
        blobs = _Restricted(io.BytesIO(payload)).load()
        if not isinstance(blobs, list) or not all(type(b) is bytes for b in blobs):
            raise pickle.UnpicklingError("not a frontend cache entry")
    except Exception as e:  # noqa: BLE001
        if not quiet:
            diskcache.warn_once("ignoring frontend entry", path, f"{type(e).__name__}: {e}",
                                "the call is traced again and the entry replaced")
        return None
    return blobs


def _record(key: str, blob: bytes):
    """One stored record, or raises Doubt (a class outside the allow-list, a changed callable)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    try:
        record = _graph_unpickler()(io.BytesIO(blob), FakeTensorMode(allow_non_fake_inputs=True)).load()
    except Doubt:
        raise
    except Exception as e:  # noqa: BLE001
        raise Doubt(f"the stored entry does not load ({type(e).__name__}: {e})") from None
    if not isinstance(record, dict) or record.get("version") != _VERSION:
        raise Doubt("not a frontend cache record of this version")
    return record


def load(key: str, cache, args: tuple, kwargs: dict):
    """A CacheEntry installed from disk whose guards accept this call, or None (then compile)."""
    if key in _STORED_HERE:
        return None
    records = _read_blobs(key)
    if not records:
        STATS["misses"] += 1
        return None
    root = cache.root
    bound_args = (root.self_obj, *args) if root.skip_first else args
    try:
        bound = root.signature.bind(*bound_args, **kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    local_values = dict(bound.arguments)
    for blob in records:
        try:
            entry = _install(_record(key, blob), cache, local_values, args, kwargs)
        except Doubt as e:
            STATS["rejected"] += 1
            _note(f"ember frontend cache: not using a stored entry of {root.name}: {e}")
            continue
        if entry is not None:
            STATS["hits"] += 1
            counters.bump_compiled("frames_loaded")
            return entry
    STATS["misses"] += 1
    return None


def _install(record, cache, local_values, args, kwargs):
    from ember.frontend.codegen import MISS
    from ember.frontend.convert import CacheEntry, _entry_ids
    from ember.frontend.guards import GLOBAL_STATE_NS, GuardSet, global_state
    from ember.frontend.variables.objects import new_object
    root = cache.root
    _load_exprs(record)
    ns = {"__MISS": MISS, "__global_state": global_state, "__new_object": new_object, **GLOBAL_STATE_NS}
    if root.skip_first:
        ns["__root_self"] = root.self_obj
    params = root.signature.parameters
    later = []
    for name, recipe in record["ns"].items():
        if recipe[0] == "at":
            later.append((name, recipe))
        elif recipe[0] == "root":
            ns[name] = root.fn
        elif recipe[0] == "default":
            p = params.get(recipe[1])
            if p is None or p.default is p.empty:
                raise Doubt(f"parameter {recipe[1]} has no default now")
            ns[name] = p.default
        else:
            ns[name] = _cook(recipe, ns, local_values)
    for _ in range(len(later) + 1):  # an expression may read a name another one binds
        pending = []
        for name, recipe in later:
            try:
                ns[name] = _cook(recipe, ns, local_values)
            except Doubt:
                pending.append((name, recipe))
        if not pending or len(pending) == len(later):
            later = pending
            break
        later = pending
    for name, recipe in later:
        ns[name] = _cook(recipe, ns, local_values)  # raises its Doubt
    for recipe in record["funcs"]:  # the bytecode the trace inlined must be the code found now
        _cook(recipe, ns, local_values)
    # the guards first (a function with the entry's checks and no body: nothing runs, nothing is
    # replayed), so a rejected entry costs no backend compile
    if _define(record, dict(ns), guards_only=True)(*args, **kwargs) is MISS:
        return None
    gm = None
    if record["has_graph"]:
        gm = rebuild_graph(record["graph"])
        try:
            example_inputs = [eval(_expr_code(e), ns, dict(local_values)) for e in record["inputs"]]  # noqa: S307 - ours
        except Exception as e:  # noqa: BLE001
            raise Doubt(f"a graph input cannot be read ({type(e).__name__})") from None
        compiled = cache.backend(gm, example_inputs)
        ns["__graph"] = compiled if compiled is not None else gm.forward
    fn = _define(record, ns)
    entry_id = next(_entry_ids)
    return CacheEntry(fn, GuardSet(), record["source"], ns, gm, record["op_count"], 0.0, entry_id,
                      record["params"], {}, cache.backend, {})


def _define(record, ns, guards_only: bool = False):
    text = record["guards_source" if guards_only else "source"]
    exec(_entry_code(record["name"], text), ns)  # noqa: S102 - ember's own text, from an entry diskcache verified
    return ns[record["name"]]


def _entry_code(name: str, text: str):
    """The code object of an entry's text, through ``diskcache.compile_cached``: a warm process finds
    it compiled (``store`` compiles both texts of a record as it writes it)."""
    source = text.encode()
    digest = diskcache.sha256(source)
    path = os.path.join(config.cache_dir, "code", digest[:2], f"{digest}.code")
    return diskcache.compile_cached(source, f"<ember entry {name} (from the frontend cache)>", path, config.cache_dir)


# The expressions an install evaluates (guard sources re-finding objects, the graph's inputs: ~320
# for GPT-2 training), compiled once per process, and kept on disk per record as their code objects:
# compiling them was ~15 ms of a warm start on a CPU. A code object is found by its exact source
# text, compiled in ``eval`` mode as ``eval(text)`` compiles it, so evaluating it is ``eval(text)``.
_EXPR_CODE: dict = {}
_EXPR_FILE = "<ember frontend expression>"
_EXPR_KIND = "frontend-expressions"


def _expr_code(text: str):
    code = _EXPR_CODE.get(text)
    if code is None:
        code = _EXPR_CODE[text] = compile(text, _EXPR_FILE, "eval")
    return code


def _exprs_of(record) -> list:
    out = list(record["inputs"])
    for recipe in (*record["ns"].values(), *record["funcs"]):
        if recipe[0] == "at":
            out.append(recipe[1])
    return out


def _exprs_path(record):
    """(path, key) of a record's stored expression code objects: named by the SHA-256 of the
    expressions and the interpreter's bytecode tag."""
    tag = sys.implementation.cache_tag or ""
    digest = diskcache.sha256("\0".join([tag, *_exprs_of(record)]).encode())
    return os.path.join(config.cache_dir, "code", digest[:2], f"{digest}.exprs"), digest


def _store_exprs(record) -> None:
    import marshal
    try:
        path, key = _exprs_path(record)
        codes = {e: _expr_code(e) for e in _exprs_of(record)}
        diskcache.write_entry(path, config.cache_dir, _EXPR_KIND, key, marshal.dumps(codes))
    except Exception as e:  # noqa: BLE001 - an expression that does not compile: it fails at install, as before
        _note(f"ember frontend cache: expressions not kept: {type(e).__name__}: {e}")


def _load_exprs(record) -> None:
    """Take a record's stored expression code objects (``_store_exprs``); none stored, or not to
    trust: each compiles when evaluated."""
    import marshal
    try:
        path, key = _exprs_path(record)
    except Exception:  # noqa: BLE001 - a record of another shape: _install says why
        return
    if not os.path.exists(path) or not diskcache.secure_dir(os.path.dirname(path), config.cache_dir, create=False):
        return
    payload = diskcache.read_entry(path, _EXPR_KIND, key)
    try:
        codes = marshal.loads(payload) if payload is not None else None
    except (ValueError, EOFError, TypeError):
        return
    if isinstance(codes, dict):
        for text, code in codes.items():
            if type(text) is str and getattr(code, "co_filename", None) == _EXPR_FILE:
                _EXPR_CODE.setdefault(text, code)
