"""A kernel-build worker process: builds Triton kernels (and their launchers) into Triton's disk cache.

Started by ``build_pool`` as ``python build_worker.py``; it reads one JSON request per line on stdin
and answers one JSON line on stdout. Why a process: a Triton build is mostly Python (the AST to
TTIR code generator) and C++ passes called with the GIL held, so threads of one process do not
overlap (measured on the H100 host: a GPT-2 graph built in the same time with 1 thread and 16).
Processes do, and each build lands in the cache directory the parent uses too, where the parent's
own build call then finds it.

This file imports neither torch nor the ``ember`` package (a worker starts in about 0.3 s instead of
about 1.5 s): a kernel module's only ember import, ``ember.native.triton_helpers``, is loaded from
its file under its full name before any kernel module (see ``load_kernel_module``), so Python never
imports the ``ember`` package itself. The parent imports kernel modules through the same function,
so ``fn.__module__`` (part of Triton's cache key) is the same on both sides.

A request names a kernel module (its file and module name), the function in it and its
specialization as Triton's ``jit_cache_hook`` serializes it (``JITFunction.preload`` takes the same
text, and compiles with the same source, signature, constants, attributes and options as the
parent's own build would), and the target (backend, arch, warp size): no CUDA context is ever created here (the target driver
below answers the two questions a build asks of a driver). The launcher (a small C module that
Triton otherwise compiles with the system C compiler at a kernel's first launch, 0.3 s each) is
built too, for the ``cuda`` backend.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import time

_HELPERS = "ember.native.triton_helpers"


def module_name(path: str) -> str:
    """The module name a generated kernel module is imported under, in any process."""
    return "ember_native_" + os.path.basename(path)[:-3]


def _import_path(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # triton.jit reads the source through the module's file
    spec.loader.exec_module(mod)
    return mod


def _package_module(name: str, filename: str):
    """A module of ember's own, loaded by file (not through the ``ember`` package) unless present."""
    mod = sys.modules.get(name)
    if mod is None:
        here = os.path.dirname(os.path.abspath(__file__))
        mod = _import_path(name, os.path.join(here, *filename.split("/")))
    return mod


def load_kernel_module(path: str, name: str | None = None, digest: str | None = None, source: bytes | None = None):
    """Import the kernel module at ``path`` (once per process), under ``name``: by default a generated
    module's (``module_name``); a fixed kernel of ember's own (``mm_kernel``) keeps its package name.
    A generated module comes with ``digest``, its SHA-256: it is executed only from bytes that match
    it, read from a file that is ours and not writable by others (``ember.diskcache``; raises its
    ``Refused``), or from ``source``, those bytes as the caller read and checked them."""
    name = name or module_name(path)
    mod = sys.modules.get(name)
    if mod is not None and getattr(mod, "__file__", None) == path and (
            digest is None or getattr(mod, "__ember_sha256__", None) == digest):
        return mod
    if digest is None:
        _package_module(_HELPERS, "triton_helpers.py")
        return _import_path(name, path)
    diskcache = _package_module("ember.diskcache", "../diskcache.py")
    if source is None:
        try:
            source = diskcache.read_source(path, digest)
        except diskcache.Refused as e:
            raise diskcache.Refused(f"{path} {e}") from None
    if _HELPERS.encode() in source:
        # (a Triton kernel module: its helpers by file, not through the ember package, in a worker; a
        # wrapper or C++ module never reads them: a warm start whose kernels are adopted from recorded
        # binaries imports no kernel module, and skips their 26 @triton.jit definitions)
        _package_module(_HELPERS, "triton_helpers.py")
    return diskcache.exec_source(name, path, source)


class TargetDriver:
    """The driver a build sees: it answers "which device" and "which target" without touching the
    GPU. Launching anything through it is an error, which is the point."""

    def __init__(self, backend: str, arch, warp_size: int):
        from triton.backends.compiler import GPUTarget
        self.target = GPUTarget(backend, arch, warp_size)

    def get_current_device(self):
        return 0

    def get_current_target(self):
        return self.target

    def __getattr__(self, name):
        raise RuntimeError(f"ember build worker: the driver has no {name!r} here (builds only)")


_DRIVERS: dict = {}


def build(req: dict) -> dict:
    """Build one kernel; returns its Triton cache hash."""
    from triton.runtime import driver
    if req.get("triton_key"):
        _take_key(req["triton_key"])
    target = tuple(req["target"])
    drv = _DRIVERS.get(target)
    if drv is None:
        drv = _DRIVERS[target] = TargetDriver(*target)
    driver.set_active(drv)
    fn = getattr(load_kernel_module(req["path"], req.get("module"), req.get("digest")), req["name"])
    launcher = req.get("launcher") and target[0] == "cuda"
    early: list = []
    if launcher:
        from triton import knobs
        old, knobs.runtime.jit_cache_hook = knobs.runtime.jit_cache_hook, _launcher_ahead(early)
    try:
        kernel = fn.preload(req["spec"])
    finally:
        if launcher:
            knobs.runtime.jit_cache_hook = old
    out = {"hash": getattr(kernel, "hash", None), "launcher": False}
    if launcher:
        if early:  # (started before the kernel's build: done beside it)
            early[0].join()
            res = early[1]
        else:  # (a kernel taking tensor descriptors: its launcher needs the build's metadata)
            res = _build_launcher(kernel.src, kernel.metadata)
        out.update(res)
    return out


class _NoScratch:
    """The metadata a launcher's C module depends on, known before the kernel is built, for a kernel
    without tensor descriptors (``make_launcher`` reads ``tensordesc_meta`` for those only; the
    scratch sizes are read after the module is compiled, into an object that is thrown away)."""
    tensordesc_meta = None
    num_ctas = 1
    global_scratch_size = global_scratch_align = profile_scratch_size = profile_scratch_align = 0
    launch_cooperative_grid = launch_pdl = False


def _build_launcher(src, metadata) -> dict:
    t0 = time.perf_counter()
    try:  # compiling it writes it to the cache; loading it needs libcuda, absent on a GPU-less host
        from triton.backends.nvidia.driver import CudaLauncher
        CudaLauncher(src, metadata)
        return {"launcher": True, "launcher_s": round(time.perf_counter() - t0, 4)}
    except Exception as e:  # noqa: BLE001 - the parent builds it at the first launch, as without us
        return {"launcher_error": f"{type(e).__name__}: {e}"[:300]}


def _launcher_ahead(early: list):
    """A ``jit_cache_hook`` that starts the kernel's launcher (its C module: the system C compiler,
    ~0.3 s on the H100 host, more than a small kernel's own build) in a thread as the build begins,
    from what it depends on: the signature and constants of the specialization (as ``ASTSource``
    holds them for the build). The compiler runs as a subprocess, so the two overlap; the first
    launch of a one-kernel graph waited for them one after the other (0.12 + 0.33 s). ``early``
    gets (thread, its result). Kernels taking tensor descriptors are left to after the build."""
    import threading

    def hook(*, fn, compile, **_):
        signature = compile["signature"]
        if not any(isinstance(t, str) and t.startswith("tensordesc") for t in signature.values()):
            from triton.compiler import ASTSource
            src = ASTSource(fn.jit_function, signature, compile["constants"])
            early[:] = [threading.Thread(target=lambda: early.append(_build_launcher(src, _NoScratch)), daemon=True)]
            early[0].start()
        return False  # (build on)
    return hook


def _take_key(key: str) -> None:
    """Use the parent's Triton cache key (``triton_key()``: a hash of Triton's sources and of
    libtriton, 0.4 GB) instead of computing it here: the same installation gives the same value,
    and a dozen workers each hashing it at once beside the parent's own hash took 0.8 s of an
    H100 host's cold first call (one hash: 0.3-0.4 s), which the first build waited for. The
    binary then lands under the key the parent looks it up with. A request without a key (the
    parent could not compute one) builds with the worker's own, as Triton does."""
    from triton.runtime import cache
    if getattr(cache.triton_key, "ember_key", None) != key:
        def given():
            return key
        given.ember_key = key
        cache.triton_key = given  # (read through the module by get_cache_key, at each build)


def main() -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or ".") == here:  # run as a script: this package's
        del sys.path[0]  # modules (cache, ir, ...) must not shadow top-level names
    # Triton imported before the first request (workers start ahead of need); its cache key comes
    # with the requests (_take_key)
    import triton.runtime.cache  # noqa: F401
    sys.stdout.write('{"ready": true}\n')
    sys.stdout.flush()
    for line in sys.stdin:
        req = json.loads(line)
        t0 = time.perf_counter()
        try:
            res = dict(build(req), ok=True)
        except BaseException as e:  # noqa: BLE001 - reported; the parent builds this kernel itself
            res = {"ok": False, "error": f"{type(e).__name__}: {e}"[:2000]}
        res.update(id=req["id"], s=round(time.perf_counter() - t0, 4))
        sys.stdout.write(json.dumps(res) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
