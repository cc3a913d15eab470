"""Triton's cache key, computed by a child process that ``import ember`` starts on a machine with an
NVIDIA GPU, while the program goes on importing and building its model.

Why: every Triton kernel build waits for ``triton.runtime.cache.triton_key()``, a hash of Triton's
sources and of libtriton (0.4 GB). Hashed in a thread beside the frontend's trace, it took 0.64 s of
a one-kernel function's 0.95 s cold first call on the H100, and the kernel's build could only start
after it (``benchmarks/results/small_cold_timeline-h100-s44-overhead.txt``): the thread takes the GIL
back once per MiB hashed while the trace runs Python. The issue's ask is that Triton's start-up work
begin at import; a child process does it on another core, sharing no GIL, before the first call.
(Building Triton's C helper module for CUDA in the child too was tried: the driver's creation then
waited for a child still hashing, 0.8 s into the first call on the H100, instead of compiling it
itself in 0.5 s: ``small_cold_timeline-h100-s44-child-driver-overhead.txt``.)

The child runs Triton's own ``triton_key()`` (the same function over the same files gives the same
value), prints it and exits. ``result()`` waits for the key; ``install`` makes this process's Triton
answer it without hashing (its JIT looks built kernels up under it), and the build workers are
handed it as before (``build_worker._take_key``). If the child fails, nothing is installed and the
key is hashed in this process as before (``runtime.prewarm_triton_key``).

Not started: when ``EMBER_TRITON_KEY_PROCESS=0`` (``ember.config.triton_key_process``), under
``TRITON_INTERPRET=1``, without an NVIDIA device node, without Triton, or in a process that
``multiprocessing`` started (its parent has the key already, and a pool of spawned workers each
hashing 0.4 GB at import would cost more than it saves).
"""
from __future__ import annotations

import functools
import os
import subprocess
import sys
import threading

_CHILD = "from triton.runtime.cache import triton_key; print('key ' + triton_key(), flush=True)"
_PROC = None  # the child process, once started (False: could not start)
_LINES: list = []  # the child's lines so far; None last once its output ended
_READ = threading.Condition()
_INSTALL = threading.Lock()


def wanted() -> bool:
    """Whether ``import ember`` starts the child (module docstring); cheap: no torch, no Triton import."""
    from ember.config import config, environment
    if not config.triton_key_process:
        return False
    if environment.triton_interpret:
        return False
    if not os.path.exists("/dev/nvidiactl"):
        return False
    mp = sys.modules.get("multiprocessing")
    if mp is not None and mp.parent_process() is not None:
        return False
    import importlib.util
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):
        return False


def start() -> None:
    """Start the child once (a few milliseconds: ``posix_spawn``), and a daemon thread reading its
    lines (blocked in ``read``: it holds no GIL); errors leave it unstarted."""
    global _PROC
    with _READ:
        if _PROC is not None:
            return
        try:
            _PROC = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True)
        except OSError:
            _PROC = False
            return
    threading.Thread(target=_reader, args=(_PROC,), name="ember-triton-key", daemon=True).start()
    import atexit
    atexit.register(_reap)


def _reader(proc) -> None:
    try:
        for raw in proc.stdout:
            with _READ:
                _LINES.append(raw.decode(errors="replace").strip())
                _READ.notify_all()
    finally:
        proc.wait()
        with _READ:
            _LINES.append(None)
            _READ.notify_all()


def _reap() -> None:
    """At exit: a child still running (nothing was compiled) is stopped and reaped."""
    proc = _PROC
    if proc and proc.poll() is None:
        proc.kill()
        proc.wait()


def started() -> bool:
    return bool(_PROC)


def _wait_for(prefix: str, timeout: float | None) -> str | None:
    """The child's first line starting with ``prefix``, waiting for it; None if its output ends, or
    ``timeout`` passes, without one."""
    with _READ:
        if not _PROC:
            return None
        found = lambda: next((ln for ln in _LINES if ln is not None and ln.startswith(prefix)), None)  # noqa: E731
        _READ.wait_for(lambda: found() is not None or (_LINES and _LINES[-1] is None), timeout)
        return found()


def result(timeout: float | None = 30.0) -> str | None:
    """The child's key (waiting for it), or None: not started, failed, or not done within ``timeout``."""
    line = _wait_for("key ", timeout)
    key = line[4:] if line else None
    return key or None



def install(key: str) -> None:
    """Make this process's ``triton_key()`` return ``key`` (the child's: the same function's value over
    the same files) without hashing, where Triton's modules call it."""
    from triton.runtime import autotuner, cache
    with _INSTALL:
        _install(key, cache, autotuner)


def _install(key: str, cache, autotuner) -> None:
    if getattr(cache.triton_key, "ember_key", None) == key:
        return

    @functools.lru_cache(maxsize=None)
    def triton_key():
        return key
    triton_key.ember_key = key
    original = cache.triton_key
    for module in (cache, autotuner):  # (the autotuner imported the name)
        if getattr(module, "triton_key", None) is original:
            module.triton_key = triton_key
