"""Triton's cache key, computed by a child process that ``import ember`` starts on a machine with an
NVIDIA GPU, while the program goes on importing and building its model.

Why: every Triton kernel build waits for ``triton.runtime.cache.triton_key()``, a hash of Triton's
sources and of libtriton (0.4 GB). Hashed in a thread beside the frontend's trace, it took 0.64 s of
a one-kernel function's 0.95 s cold first call on the H100, and the kernel's build could only start
after it (``benchmarks/results/small_cold_timeline-h100-s44-overhead.txt``): the thread takes the GIL
back once per MiB hashed while the trace runs Python. The issue's ask is that Triton's start-up work
begin at import; a child process does it on another core, sharing no GIL, before the first call.

The child runs Triton's own ``triton_key()`` (the same function over the same files gives the same
value), prints it and exits. ``result()`` waits for it; ``install`` makes this process's Triton
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

_CHILD = "from triton.runtime.cache import triton_key; print(triton_key(), flush=True)"
_PROC = None  # the child process, once started
_RESULT: list = []  # [key or None], once read
_LOCK = threading.Lock()


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
    """Start the child once (a few milliseconds: ``posix_spawn``); errors leave it unstarted."""
    global _PROC
    with _LOCK:
        if _PROC is not None:
            return
        try:
            _PROC = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True)
        except OSError:
            _PROC = False
            return
    import atexit
    atexit.register(_reap)


def _reap() -> None:
    """At exit: a child never waited for (nothing was compiled) is stopped and reaped."""
    proc = _PROC
    if proc and proc.poll() is None:
        proc.kill()
        proc.wait()
    if proc and proc.stdout is not None:
        proc.stdout.close()


def started() -> bool:
    return bool(_PROC)


def result(timeout: float | None = 30.0) -> str | None:
    """The child's key (waiting for it), or None: not started, failed, or not done within ``timeout``."""
    with _LOCK:
        if _RESULT:
            return _RESULT[0]
        proc = _PROC
        if not proc:
            return None
        key = None
        try:
            out, _ = proc.communicate(timeout=timeout)
            text = out.decode().strip().splitlines()
            if proc.returncode == 0 and text and text[-1]:
                key = text[-1]
        except (subprocess.TimeoutExpired, OSError, ValueError, UnicodeDecodeError):
            proc.kill()
        _RESULT.append(key)
        return key


def install(key: str) -> None:
    """Make this process's ``triton_key()`` return ``key`` (the child's: the same function's value over
    the same files) without hashing, where Triton's modules call it."""
    from triton.runtime import autotuner, cache
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
