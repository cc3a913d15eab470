"""Warm starts without Triton's JIT: each launch site's compiled kernel, recorded beside its graph.

A process that finds a graph in the native cache still had every kernel go through Triton's JIT at
its first launch: Triton hashes its own sources for the cache key (``triton_key``: 0.4 s on the H100
host), binds and specializes the arguments, looks the binary up on disk, and only then loads it. For
GPT-2 inference that was 0.86 s of a 1.1 s warm first call. What the JIT finds is known after the
first process's first call: per launch site, the files of the binary Triton cached (cubin and
metadata, relative to Triton's cache directory), what Triton's launcher is generated from (argument
names, signature, constants), and the pointer alignment the kernel was specialized for.

``remember`` notes the graphs a process compiled (or loaded without a record); at exit ``flush``
writes a record per graph whose sites have their kernels (an ``ember.diskcache`` entry of kind
``native-launches`` next to the graph's record: each distinct binary once, ``pack``; and the code
objects of the sites' fast-path factories beside it). A later process ``adopt_recorded``: each site gets its
``CompiledKernel`` straight from those files (``Launch.adopt``, the path AOT packages take), so the
first call runs no JIT. Anything unexpected (a file gone, another Triton's internals, a record not
to trust) leaves that site on the JIT path, which finds the same binary: slower to start, same result.
"""
from __future__ import annotations

import json
import os
import sys
import threading

from ember import diskcache

_KIND = "native-launches"
STATS = {"recorded": 0, "adopted": 0, "jit": 0}
_PENDING: dict = {}  # key -> (base, wrapper module) of graphs whose record is written at exit
_LOCK = threading.Lock()
_HOOKED = False


def _path(key: str, base: str | None) -> str:
    from ember.native import cache
    return os.path.join(cache.root(base), "graphs", key[:2], f"{key}.launches.json")


_CODE_KIND = "native-launch-factories"


def _code_path(key: str, base: str | None) -> str:
    """Where the code objects of a graph's fast-path factories are kept (``runtime.factory_codes``):
    marshal data, for this interpreter's bytecode only."""
    return f"{_path(key, base)[:-5]}.{sys.implementation.cache_tag or 'py'}.code"


def _code_key(key: str) -> str:
    return f"{key}:{sys.implementation.cache_tag}"


def _store_factories(mod, key: str, base: str | None, root: str) -> None:
    """Keep the code objects of the fast-path factories ``mod``'s sites run (each under its exact
    source text), for ``_prime_factories`` in a later process."""
    import marshal

    from ember.native import runtime
    from ember.native.dynamic_launch import DynamicLaunch
    sources = {site.fast_source for _name, site, _owner in _sites(mod, DynamicLaunch)
               if isinstance(site, runtime.Launch) and site.fast is not None}
    if sources:
        diskcache.write_entry(_code_path(key, base), root, _CODE_KIND, _code_key(key),
                              marshal.dumps(runtime.factory_codes(sorted(sources))))


def _prime_factories(key: str, base: str | None) -> None:
    """The stored fast-path factories of a graph's sites (``_store_factories``), taken by ``runtime``
    before its sites adopt their kernels (none stored, or not loadable: they are compiled)."""
    import marshal

    from ember.native import runtime
    path = _code_path(key, base)
    payload = diskcache.read_entry(path, _CODE_KIND, _code_key(key)) if os.path.exists(path) else None
    if payload is None:
        return
    try:
        codes = marshal.loads(payload)
    except (ValueError, EOFError, TypeError):
        return
    if isinstance(codes, dict):
        runtime.prime_factories(codes)


def _triton_cache_dir() -> str | None:
    try:
        from triton import knobs
        return knobs.cache.dir
    except Exception:  # noqa: BLE001 - no Triton (CPU): nothing to record
        return None


def describe(mod, cache_root: str | None) -> dict:
    """Per launch site of the wrapper module ``mod`` (its ``launchN`` globals), the Triton kernel its
    first call compiled: the cache files of the binary and metadata (relative to ``cache_root``),
    what Triton's launcher is generated from, and the pointer alignment it was built for. Sites that
    cannot be described are left out (they go through Triton's JIT)."""
    from ember.native.dynamic_launch import DynamicLaunch
    from ember.native.runtime import Launch

    out: dict = {}
    if mod is None or not cache_root:
        return out
    for name, site, owner in _sites(mod, DynamicLaunch):
        if not isinstance(site, Launch) or site.kernel is None or site.checks is None:
            continue
        k = site.kernel
        src = getattr(k, "src", None)
        group = getattr(k, "metadata_group", None)
        if src is None or not group:
            continue
        files = {f: os.path.relpath(p, cache_root) for f, p in group.items()}
        if any(rel.startswith("..") or os.path.isabs(rel) for rel in files.values()):
            continue  # (a binary outside the cache directory: not recorded)
        nargs = len(site.fn.arg_names) - sum(n in site.meta for n in site.fn.arg_names)
        entry = {"hash": k.hash, "files": files,
                 "arg_names": list(src.fn.arg_names), "signature": dict(src.signature),
                 "constants": [[list(key), value] for key, value in src.constants.items()],
                 "checks": [list(c) for c in site.checks], "nargs": nargs}
        if owner is not None:
            entry["owner"] = owner
        try:
            json.dumps(entry)
        except TypeError:  # a constant JSON cannot hold: this site goes through the JIT
            continue
        out[name] = entry
    return out


def _sites(mod, dynamic_cls):
    """(record name, Launch, owner) for the launch sites of a wrapper module: its ``launchN``
    globals (a ``DynamicLaunch``: its first site with a kernel), and the sites small-matmul externs
    (``SmallMM`` globals) keep per TF32 setting, recorded with their owner's name and key."""
    for name, obj in vars(mod).items():
        if isinstance(obj, dynamic_cls):
            yield name, next((s for s in obj.sites.values() if s.kernel is not None), None), None
        elif isinstance(getattr(obj, "launches", None), dict) and type(obj).__name__ == "SmallMM":
            for key, site in obj.launches.items():
                if isinstance(key, bool):
                    yield f"{name}[{key}]", site, [name, key]
        else:
            yield name, obj, None


class _LauncherSource:
    """What Triton's launcher is generated from (``CompiledKernel.src``): argument names, signature
    and constants, as recorded."""

    class _Fn:
        def __init__(self, arg_names):
            self.arg_names = arg_names
            self.launch_metadata = None

    def __init__(self, entry: dict):
        self.fn = self._Fn(entry["arg_names"])
        self.signature = dict(entry["signature"])
        self.constants = {tuple(k): v for k, v in entry["constants"]}


_KERNEL_FIELDS = ("hash", "files", "arg_names", "signature", "constants")  # (a binary's; the rest is the site's)


def pack(launches: dict) -> tuple[list, dict]:
    """(kernels, sites) of ``describe``'s entries as a record keeps them: each distinct binary once
    (its hash, files, launcher source), each site its index there (``"kernel"``), alignment checks,
    number of arguments and owner. A layer's kernels repeat per layer (GPT-2 training: 377 sites, 39
    binaries): the record is a tenth of the size, and ``adopt`` tells binaries apart by index
    instead of comparing every site's signature and constants."""
    kernels: list = []
    index: dict = {}
    sites: dict = {}
    for name, entry in launches.items():
        ident = _ident(entry)
        if ident not in index:
            index[ident] = len(kernels)
            kernels.append({f: entry[f] for f in _KERNEL_FIELDS})
        sites[name] = dict({k: v for k, v in entry.items() if k not in _KERNEL_FIELDS}, kernel=index[ident])
    return kernels, sites


def _ident(entry: dict) -> tuple:
    """A recorded binary's identity: the same hash, files and launcher source."""
    return (entry["hash"], tuple(sorted(entry["files"].items())), _frozen(entry["arg_names"]),
            _frozen(entry["signature"]), _frozen(entry["constants"]))


class Packed(dict):
    """The sites of a packed record (``pack``), with the record's ``kernels`` they index."""

    def __init__(self, sites: dict, kernels: list):
        super().__init__(sites)
        self.kernels = kernels


def adopt(mod, launches: dict, cache_root: str, info: dict) -> None:
    """Give each launch site of ``mod`` named in ``launches`` its kernel straight from the recorded
    binary and metadata (Triton's ``CompiledKernel``: the cubin is loaded, the launcher comes from
    Triton's cache), so the first call runs no Triton JIT. A site this cannot handle keeps the JIT
    path; ``info`` counts ``kernels_loaded`` and ``kernels_jit`` and says why in ``reason``.
    ``launches``: per site, ``describe``'s entry, or (a ``Packed`` record, ``pack``) the site's part
    of it, whose ``"kernel"`` indexes the record's ``kernels``."""
    kernels = getattr(launches, "kernels", None)
    try:
        from triton.compiler.compiler import CompiledKernel
        from ember.native.dynamic_launch import DynamicLaunch
        from ember.native.runtime import KernelRef
    except Exception as e:  # noqa: BLE001
        info["reason"] = f"{type(e).__name__}: {e}"
        info["kernels_jit"] = info.get("kernels_jit", 0) + len(launches)
        return
    root = os.path.abspath(cache_root)
    # one CompiledKernel (one module load) per binary, its files checked once: a layer's kernels
    # repeat per layer (GPT-2 training: 432 sites), so what a site adds is a few dict lookups
    loaded: dict = {}
    for name, entry in launches.items():
        owner = entry.get("owner")
        if owner is not None:  # (a SmallMM's site for the TF32 setting recorded; made at the module's load)
            site = getattr(getattr(mod, owner[0], None), "launches", {}).get(owner[1])
        else:
            site = getattr(mod, name, None)
        ok = False
        try:
            if kernels is None:
                binary, ident = entry, _ident(entry)
            else:
                ident = entry["kernel"]
                if type(ident) is not int or not 0 <= ident < len(kernels):
                    raise ValueError(f"kernel index {ident!r} is not in the record")
                binary = kernels[ident]
            kernel = loaded.get(ident)
            if kernel is None:
                group = {f: os.path.abspath(os.path.join(root, rel)) for f, rel in binary["files"].items()}
                if not all(p.startswith(root + os.sep) and os.path.isfile(p) for p in group.values()):
                    raise FileNotFoundError("a recorded binary is not in Triton's cache")
                kernel = loaded[ident] = CompiledKernel(_LauncherSource(binary), group, binary["hash"])
            checks = tuple(tuple(c) for c in entry["checks"])
            fn = getattr(site, "fn", None)
            if isinstance(fn, KernelRef) and fn._fn is None:  # (what adopting reads of it: its module not imported)
                fn.arg_names = list(binary["arg_names"])
            if isinstance(site, DynamicLaunch):
                kernel.run  # noqa: B018 - loads the binary and the launcher now, or raises here
                site.template = (kernel, checks, entry["nargs"])
                ok = True
            elif site is not None and site.fast is None:
                ok = site.adopt(kernel, checks, entry["nargs"])
        except Exception as e:  # noqa: BLE001 - any surprise in Triton's internals: the JIT path
            info["reason"] = f"{name}: {type(e).__name__}: {e}"
        k = "kernels_loaded" if ok else "kernels_jit"
        info[k] = info.get(k, 0) + 1


def _frozen(v):
    """A JSON value as a hashable one (lists as tuples, dicts as sorted item tuples): a binary's identity."""
    if isinstance(v, dict):
        return ("{",) + tuple(sorted((k, _frozen(x)) for k, x in v.items()))
    if isinstance(v, list):
        return tuple(_frozen(x) for x in v)
    return (type(v).__name__, v)  # (True and 1 are one key in a dict: not here)


def adopt_recorded(mod, key: str, base: str | None) -> dict | None:
    """A cached graph's wrapper ``mod`` takes its recorded kernels (``adopt``); returns the counts
    (None: no record, or no Triton cache to read them from)."""
    from ember.config import environment
    if environment.triton_interpret:
        return None
    path = _path(key, base)
    record = diskcache.read_json(path, _KIND, key) if os.path.exists(path) else None
    # binaries are for one GPU architecture and Triton (a cache directory may be shared by machines)
    if not isinstance(record, dict) or record.get("env") != _env() or not isinstance(record.get("launches"), dict):
        return None
    launches, kernels = record["launches"], record.get("kernels")
    if kernels is not None and not isinstance(kernels, list):
        return None
    from ember.native import triton_cache
    triton_cache.ensure_safe()  # (the launcher modules load from Triton's cache: checked, maybe redirected)
    cache_root = _triton_cache_dir()
    if not cache_root:
        return None
    from ember.native import runtime
    prewarm = runtime._DRIVER_PREWARM
    if prewarm and prewarm.is_alive():  # (Triton's driver, which adopting reads: not created twice at once)
        prewarm.join()
    _prime_factories(key, base)
    info: dict = {}
    adopt(mod, launches if kernels is None else Packed(launches, kernels), cache_root, info)
    STATS["adopted"] += info.get("kernels_loaded", 0)
    STATS["jit"] += info.get("kernels_jit", 0)
    return info


def _env() -> list:
    """What the recorded binaries depend on beyond their graph: the GPU's architecture and Triton."""
    try:
        import torch
        import triton
        cap = list(torch.cuda.get_device_capability()) if torch.cuda.is_available() else None
        return [cap, triton.__version__]
    except Exception:  # noqa: BLE001
        return [None, None]


def remember(key: str, base: str | None, mod) -> None:
    """Record ``mod``'s kernels under ``key`` when this process exits (its sites have them by then)."""
    global _HOOKED
    with _LOCK:
        _PENDING[key] = (base, mod)
        if not _HOOKED:
            import atexit
            atexit.register(flush)
            _HOOKED = True


def flush() -> int:
    """Write the records of the remembered graphs whose sites have their kernels; returns how many."""
    with _LOCK:
        pending = list(_PENDING.items())
        _PENDING.clear()
    cache_root = _triton_cache_dir()
    done = 0
    for key, (base, mod) in pending:
        try:
            launches = describe(mod, cache_root)
            if not launches:
                continue
            from ember.native import cache
            path = _path(key, base)
            if diskcache.secure_dir(os.path.dirname(path), cache.root(base)):
                kernels, sites = pack(launches)
                payload = json.dumps({"env": _env(), "kernels": kernels, "launches": sites}).encode()
                if diskcache.write_entry(path, cache.root(base), _KIND, key, payload):
                    done += 1
                    _store_factories(mod, key, base, cache.root(base))
        except Exception:  # noqa: BLE001 - at exit: a record not written only costs the next start time
            continue
    STATS["recorded"] += done
    return done
