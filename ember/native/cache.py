"""On-disk caches of the native backend, keyed by content.

* ``kernels/<hh>/<sha>.py``: one generated Triton kernel module per distinct source.
* ``graphs/<hh>/<key>.py`` + ``.json``: the wrapper of a compiled graph and its report. The key hashes
  the graph's code, the example inputs' metadata, constant tensors, options, the versions of torch
  and Triton, and the source of this package (so editing the compiler invalidates old entries).
  For a graph with symbolic sizes the inputs are described symbolically (``s0``-style sizes and
  their ranges, not the sizes of the first call), so one entry serves every size.

Trust (``ember.diskcache``): every directory is ours with mode 0700, or the cache is refused (logged
once) and this process works in a private scratch directory instead. The ``.json`` record is an
envelope naming its key and the payload's SHA-256 (a record copied under another key, truncated or
corrupt is a miss, regenerated and replaced); it records the wrapper's SHA-256, and a kernel's file
name is its SHA-256. Generated modules are imported only from bytes that match their digest, from
files that are ours and not writable by others; anything else is a miss and is regenerated.

Files are written to a temporary name and renamed, so a concurrent reader sees all or nothing.
A second process compiling the same graph finds the wrapper and skips lowering and code generation.
Triton keeps its own cache of compiled binaries (``TRITON_CACHE_DIR``, outside ``cache_dir``), under
the same ownership and mode checks (``triton_cache``).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os

import torch

from ember import diskcache
from ember.config import environment

_MODULES: dict = {}  # path, and (path, digest) -> module
_GRAPH_KIND = "native-graph"


def root(base: str | None = None) -> str:
    """``<cache_dir>/native``, or this process's scratch directory when that one is refused."""
    if base is None:
        from ember.config import config
        base = config.cache_dir
    path = os.path.join(base, "native")
    return path if diskcache.secure_dir(path, base) else diskcache.scratch_dir("native")


def _subdir(path: str, base: str | None, create: bool = True) -> bool:
    """Make (``create``) ``path``'s directory under ``root(base)`` and check every level of it."""
    return diskcache.secure_dir(os.path.dirname(path), root(base), create)


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def write_source(kind: str, text: str, base: str | None = None, key: str | None = None) -> str:
    """Store generated source (kernels are named by their SHA-256, wrappers by their graph key); an
    existing file is kept only if it is ours and holds exactly this text."""
    key = key or sha(text)
    path = os.path.join(root(base), kind, key[:2], f"{key}.py")
    data = text.encode()
    try:
        if diskcache.read_source(path, diskcache.sha256(data)) == data:
            return path
    except (diskcache.Refused, OSError):
        pass
    if not _subdir(path, base):  # (a level below the root turned foreign: use the scratch directory)
        scratch = diskcache.scratch_dir("native")
        path = os.path.join(scratch, kind, key[:2], f"{key}.py")
        diskcache.secure_dir(os.path.dirname(path), scratch)
    diskcache.atomic_write(path, data)
    return path


def verified_source(path: str) -> bytes:
    """The bytes of the generated kernel module at ``path``, checked as ``load_module`` checks them
    before executing them (the file ours, its SHA-256 its name); raises ``diskcache.Refused``."""
    try:
        return diskcache.read_source(path, os.path.basename(path)[:-3])
    except diskcache.Refused as e:
        raise diskcache.Refused(f"{path} {e}") from None


def loaded_module(path: str):
    """The module this process imported from ``path`` (``load_module``), or None."""
    return _MODULES.get(path)


def load_module(path: str, digest: str | None = None, source: bytes | None = None):
    """Import a generated module from its path once per process (under the name a build worker
    gives it too: the name is part of Triton's cache key), after checking its file and that its
    SHA-256 is ``digest``; raises ``diskcache.Refused`` otherwise. Without ``digest``: the module
    this process already imported from ``path``, else the digest is the file's name (as kernels
    are named). ``source``: the module's bytes, read and checked already (``verified_source``)."""
    if digest is None:
        mod = _MODULES.get(path)
        if mod is not None:
            return mod
        digest = os.path.basename(path)[:-3]
    mod = _MODULES.get((path, digest))
    if mod is None:
        from ember.locks import COMPILE_LOCK
        from ember.native.build_worker import load_kernel_module
        with COMPILE_LOCK:  # one module object per path, also when threads load it at once
            mod = _MODULES.get((path, digest))
            if mod is None:
                mod = _MODULES[(path, digest)] = _MODULES[path] = load_kernel_module(path, digest=digest, source=source)
    return mod


@functools.lru_cache(maxsize=1)
def compiler_fingerprint() -> str:
    """Hash of this package's sources and the library versions."""
    h = hashlib.sha256()
    diskcache.hash_sources(h, os.path.dirname(__file__))
    try:
        import triton
        tv = triton.__version__
    except ImportError:
        tv = "none"
    h.update(f"{torch.__version__}|{tv}|{int(environment.triton_interpret)}".encode())
    return h.hexdigest()


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"T{tuple(x.shape)}{tuple(x.stride())}{x.storage_offset()}{x.dtype}{x.device}"
    return f"{type(x).__name__}:{x!r}"


def _describe_symbolic(gm: torch.fx.GraphModule, example_inputs) -> list[str]:
    """The inputs of a graph with symbolic sizes, as the IR will see them: sizes as expressions over
    the canonical size symbols, with the symbols' ranges (they choose persistent reductions) but not
    their hints, so every size meets the same entry."""
    from ember.native.symbolic import SizeVars, active, norm, norm_sizes
    sv, out = SizeVars(), []
    with active(sv):
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        for n, x in zip(placeholders, example_inputs):
            v = n.meta.get("val")
            if isinstance(v, torch.Tensor):
                sizes = (norm_sizes(v.shape), norm_sizes(v.stride()), norm(v.storage_offset()))
                out.append(f"T{sizes}{v.dtype}{v.device}")
            elif isinstance(v, torch.SymInt):
                out.append(f"I{norm(v)}")
            else:
                out.append(_describe(x))
    out.append(str(sorted((str(s), sv.lower[s], sv.upper[s]) for s in sv.hints)))
    return out


def graph_key(gm: torch.fx.GraphModule, example_inputs, options: dict) -> str:
    """Graph code, input metadata (symbolic structure for dynamic graphs), constants, options."""
    from ember.native.symbolic import has_symbolic_inputs
    h = hashlib.sha256()
    h.update(compiler_fingerprint().encode())
    h.update(gm.code.encode())
    descs = _describe_symbolic(gm, example_inputs) if has_symbolic_inputs(gm) else map(_describe, example_inputs)
    for d in descs:
        h.update(d.encode())
    from ember.aot.deferred import get_attr_targets  # (a graph from the aot cache answers without its nodes)
    for target in get_attr_targets(gm):
        t = getattr(gm, target)
        h.update(_describe(t).encode())
        if isinstance(t, torch.Tensor):
            h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    h.update(json.dumps(options, sort_keys=True, default=str).encode())
    return h.hexdigest()


def _record_path(key: str, base: str | None) -> str:
    return os.path.join(root(base), "graphs", key[:2], f"{key}.json")


def lookup_graph(key: str, base: str | None = None) -> dict | None:
    """The record of the graph compiled under ``key``, or None (missing or not to trust)."""
    path = _record_path(key, base)
    payload = diskcache.read_entry(path, _GRAPH_KIND, key) if _subdir(path, base, create=False) else None
    if payload is None:
        return None
    try:
        info = json.loads(payload)
    except ValueError as e:
        diskcache.warn_once("ignoring native-graph entry", path, f"unreadable record: {e}", "it is regenerated")
        return None
    if not isinstance(info.get("wrapper"), str) or not isinstance(info.get("wrapper_sha256"), str):
        return None
    return info


def load_wrapper(info: dict, key: str):
    """The wrapper module of a cached record (its kernels verified and imported with it), or None:
    a file that is missing, foreign or not the one recorded is a miss (logged once)."""
    try:
        return load_module(info["wrapper"], info["wrapper_sha256"])
    except (diskcache.Refused, OSError) as e:
        diskcache.warn_once("ignoring native-graph entry", info["wrapper"], f"{type(e).__name__}: {e}",
                            f"graph {key[:16]} is compiled again and its files replaced")
        return None


def store_graph(key: str, wrapper_src: str, info: dict, base: str | None = None) -> str:
    path = write_source("graphs", wrapper_src, base, key=key)
    info = dict(info, wrapper=path, wrapper_sha256=sha(wrapper_src))
    record = _record_path(key, base)
    if _subdir(record, base):
        diskcache.write_entry(record, root(base), _GRAPH_KIND, key, json.dumps(info, indent=1).encode())
    return path
