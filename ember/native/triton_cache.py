"""Triton's own on-disk cache under ember's trust policy (``ember.diskcache``).

Triton keeps compiled kernels and the C launcher and driver modules (``.so`` files it imports into
this process) in ``triton.knobs.cache.dir`` (``TRITON_CACHE_DIR``, default ``~/.triton/cache``);
with ``TRITON_KERNEL_DUMP`` / ``TRITON_KERNEL_OVERRIDE`` it also writes ``dump_dir`` and reads
``override_dir`` (an override replaces a kernel's IR: code, too). A directory another user can
write lets them plant a module that ember's process loads, so before ember first has Triton build
or load anything (``ensure_safe``: the native backend's compile, the runtime prewarm, the build
pool's start, a kernel's first launch) every level of each directory Triton will use, from its
root (``~/.triton`` for the default locations, else the directory itself) down, must be ours and
not writable by group or others. An unsafe one is never used: one warning names it, the problem
and the fix, and Triton is pointed (through its knobs, which also set the environment variable)
at a private directory: ``<cache_dir>/triton/<what>`` when ember's cache directory passes the same
checks, else a scratch directory of this process. A safe directory is left as the user set it.
The build workers (``build_pool``) get the checked directories in their environment
(``worker_env``). Each directory is checked once per process (``_SAFE``), not per call.
"""
from __future__ import annotations

import os
import threading

from ember import diskcache
from ember.config import environment

# (Triton knob in ``knobs.cache``, its environment variable, the ``knobs.compilation`` flag under which
# Triton uses it (None: always), the private subdirectory that replaces it, what it holds)
DIRS = (
    ("dir", "TRITON_CACHE_DIR", None, "cache", "cache (compiled kernels and launcher modules)"),
    ("dump_dir", "TRITON_DUMP_DIR", "dump_ir", "dump", "dump directory"),
    ("override_dir", "TRITON_OVERRIDE_DIR", "override", "override", "kernel override directory"),
)
_SAFE: set = set()  # directories checked (or chosen) in this process and fine
_LOCK = threading.Lock()


def cache_root(path: str, home: str) -> str:
    """Where the walk of ``path``'s levels starts: ``<home>/.triton`` for Triton's default locations
    (which Triton creates), else ``path`` itself (a directory the user chose)."""
    path, base = os.path.abspath(path), os.path.abspath(os.path.join(home, ".triton"))
    return base if path == base or path.startswith(base + os.sep) else path


def private_dir(sub: str, base: str | None = None) -> str:
    """A directory of ours (mode 0700) for Triton's ``sub`` files: under ember's cache directory
    ``base`` (default ``config.cache_dir``) when that passes the checks, else in this process's
    scratch directory."""
    if base is None:
        from ember.config import config
        base = config.cache_dir
    path = os.path.join(base, "triton", sub)
    if diskcache.secure_dir(path, base):
        return path
    path = os.path.join(diskcache.scratch_dir("triton"), sub)
    diskcache.secure_dir(path, os.path.dirname(path))
    return path


def _used(knobs, flag: str | None) -> bool:
    return flag is None or bool(getattr(knobs.compilation, flag, False))


def ensure_safe(base: str | None = None) -> None:
    """Check every directory Triton will use (once each per process) and redirect Triton away from
    an unsafe one (see the module's docstring). Never raises into a compile: without Triton there
    is nothing to check."""
    try:
        from triton import knobs
    except ImportError:
        return
    for attr, env, flag, sub, what in DIRS:
        if not _used(knobs, flag):
            continue
        path = getattr(knobs.cache, attr)
        if not path or path in _SAFE:  # (an empty TRITON_CACHE_DIR turns Triton's cache off)
            continue
        with _LOCK:
            path = getattr(knobs.cache, attr)
            if path in _SAFE:
                continue
            found = diskcache.dir_problem(path, cache_root(path, knobs.cache.home_dir))
            if found is None:
                _SAFE.add(path)
                continue
            level, problem, mode_or_owner = found
            private = private_dir(sub, base)
            fix = ("`chown $USER` and `chmod 700` it" if mode_or_owner else "make it a writable directory of your own")
            diskcache.warn_once(f"not letting Triton use its {what}", level, problem,
                                f"Triton uses {private} instead; fix: {fix}, or set {env} to a directory of your own")
            setattr(knobs.cache, attr, private)  # (a knob also sets its environment variable...)
            environment.set(env, private)  # (...unless triton.knobs.propagate_env is off)
            _SAFE.add(private)


def worker_env() -> dict:
    """The environment of a build worker process: this one's, with Triton's directories as this
    process uses them (checked by ``ensure_safe``), so a worker writes where this process reads and
    never where this process refused to."""
    try:
        from triton import knobs
    except ImportError:
        return environment.for_child()
    return environment.for_child(**{var: path for attr, var, flag, _sub, _what in DIRS
                                    if _used(knobs, flag) and (path := getattr(knobs.cache, attr))})
