"""On-disk caches of the native backend, keyed by content.

* ``kernels/<hh>/<sha>.py``: one generated Triton kernel module per distinct source.
* ``graphs/<hh>/<key>.py`` + ``.json``: the wrapper of a compiled graph and its report. The key hashes
  the graph's code, the example inputs' metadata, constant tensors, options, the versions of torch
  and Triton, and the source of this package (so editing the compiler invalidates old entries).
  For a graph with symbolic sizes the inputs are described symbolically (``s0``-style sizes and
  their ranges, not the sizes of the first call), so one entry serves every size.

Files are written to a temporary name and renamed, so a concurrent reader sees all or nothing.
A second process compiling the same graph finds the wrapper and skips lowering and code generation.
Triton keeps its own cache of compiled binaries (``TRITON_CACHE_DIR``).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile

import torch

_MODULES: dict[str, object] = {}


def root(base: str | None = None) -> str:
    if base is None:
        from ember.config import config
        base = config.cache_dir
    return os.path.join(base, "native")


def _atomic_write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def write_source(kind: str, text: str, base: str | None = None, key: str | None = None) -> str:
    key = key or sha(text)
    path = os.path.join(root(base), kind, key[:2], f"{key}.py")
    if not os.path.exists(path):
        _atomic_write(path, text)
    return path


def load_module(path: str):
    """Import a generated module from its path once per process (under the name a build worker
    gives it too: the name is part of Triton's cache key)."""
    mod = _MODULES.get(path)
    if mod is None:
        from ember.locks import COMPILE_LOCK
        from ember.native.build_worker import load_kernel_module
        with COMPILE_LOCK:  # one module object per path, also when threads load it at once
            mod = _MODULES.get(path)
            if mod is None:
                mod = _MODULES[path] = load_kernel_module(path)
    return mod


@functools.lru_cache(maxsize=1)
def compiler_fingerprint() -> str:
    """Hash of this package's sources and the library versions."""
    h = hashlib.sha256()
    here = os.path.dirname(__file__)
    for name in sorted(os.listdir(here)):
        if name.endswith(".py"):
            with open(os.path.join(here, name), "rb") as f:
                h.update(name.encode() + f.read())
    try:
        import triton
        tv = triton.__version__
    except ImportError:
        tv = "none"
    h.update(f"{torch.__version__}|{tv}|{os.environ.get('TRITON_INTERPRET', '0')}".encode())
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
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            t = getattr(gm, n.target)
            h.update(_describe(t).encode())
            if isinstance(t, torch.Tensor):
                h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    h.update(json.dumps(options, sort_keys=True, default=str).encode())
    return h.hexdigest()


def lookup_graph(key: str, base: str | None = None) -> dict | None:
    meta = os.path.join(root(base), "graphs", key[:2], f"{key}.json")
    try:
        with open(meta) as f:
            info = json.load(f)
    except (OSError, ValueError):
        return None
    if not os.path.exists(info.get("wrapper", "")) or not all(os.path.exists(p) for p in info.get("kernels", [])):
        return None
    return info


def store_graph(key: str, wrapper_src: str, info: dict, base: str | None = None) -> str:
    path = write_source("graphs", wrapper_src, base, key=key)
    info = dict(info, wrapper=path)
    _atomic_write(os.path.join(root(base), "graphs", key[:2], f"{key}.json"), json.dumps(info, indent=1))
    return path
