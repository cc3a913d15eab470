"""Triton's cache key (``triton_key``) kept on disk, under a fingerprint of the files it hashes.

Why: ``triton.runtime.cache.triton_key()`` is a SHA-256 of Triton's compiler, backend and language
sources and of libtriton (0.4 GB): 0.3-0.4 s on the H100 host, ~1 s on a 2-core CPU machine. Every
process that builds a kernel pays it once (a background thread of ember's, beside the frontend's
tracing), and so does every build worker before it can say it is ready: on a small graph's cold
compile that worker start-up is the critical path (the one kernel waits for it). The value depends
only on those files' bytes, so it is stored here under a fingerprint of their metadata (each file's
path, size, mtime and inode, and Triton's version: a walk of ~300 files, ~3 ms) and reused while no
file changed. Any change to a file the hash reads (an upgrade, a rebuild, an edit) changes the
fingerprint: a miss, and the key is computed as Triton computes it and stored again. The walk covers
a superset of what ``triton_key`` reads (every file under its directories, ``__pycache__`` aside),
so it can only miss more often, never reuse a stale key.

``install(value)`` makes ``triton.runtime.cache.triton_key`` (and the autotuner's imported name)
return ``value``: ``get_cache_key``, which keys every compiled kernel, looks the name up at each call.
A build worker gets the value on its command line (``worker_args``) and installs it the same way
(it imports neither torch nor ember), instead of hashing.
"""
from __future__ import annotations

import hashlib
import os
import sys

KIND = "triton_key"
_INSTALLED: str | None = None  # the value this process installed (and hands to its build workers)
# directories under Triton's package whose files triton_key() reads, and the one file it reads above them
_DIRS = ("compiler", "backends", "language", "_C")
_FILES = (os.path.join("runtime", "cache.py"),)


def fingerprint() -> str | None:
    """A digest of Triton's version and the path, size, mtime and inode of every file ``triton_key``
    can read; None without Triton."""
    try:
        import triton
    except ImportError:
        return None
    root = os.path.dirname(os.path.abspath(triton.__file__))
    h = hashlib.sha256(f"{getattr(triton, '__version__', '?')}\n{root}\n".encode())
    paths = [os.path.join(root, f) for f in _FILES]
    for sub in _DIRS:
        for d, dirs, files in os.walk(os.path.join(root, sub)):
            dirs[:] = sorted(x for x in dirs if x != "__pycache__")  # (bytecode is not hashed by Triton)
            paths += [os.path.join(d, f) for f in sorted(files)]
    for p in paths:
        try:
            st = os.stat(p)
        except OSError:
            h.update(f"{p} missing\n".encode())
            continue
        h.update(f"{p} {st.st_size} {st.st_mtime_ns} {st.st_ino}\n".encode())
    return h.hexdigest()


def _path(fp: str) -> tuple[str, str]:
    from ember.config import config
    return os.path.join(config.cache_dir, "triton", "key", fp[:32] + ".key"), config.cache_dir


def install(value: str) -> None:
    """Make Triton's ``triton_key()`` answer ``value`` in this process."""
    global _INSTALLED
    _set(value)
    _INSTALLED = value


def _set(value: str) -> None:
    import triton.runtime.cache as cache

    def triton_key() -> str:  # (stored by ember.native.triton_keys: the hash of the same files)
        return value
    cache.triton_key = triton_key
    autotuner = sys.modules.get("triton.runtime.autotuner")
    if autotuner is not None and hasattr(autotuner, "triton_key"):
        autotuner.triton_key = triton_key


def installed() -> str | None:
    return _INSTALLED


def load() -> bool:
    """Install the stored key if the files are as they were when it was stored; False on a miss
    (nothing stored, Triton changed, or an entry ember does not trust: ``diskcache.read_entry``)."""
    if _INSTALLED is not None:
        return True
    fp = fingerprint()
    if fp is None:
        return False
    from ember import diskcache
    path, _root = _path(fp)
    payload = diskcache.read_entry(path, KIND, fp)
    if not payload:
        return False
    install(payload.decode())
    return True


def compute_and_store() -> str | None:
    """``triton_key()`` computed by Triton, stored under the files' fingerprint when they did not
    change while it was hashed. Returns the key (None without Triton)."""
    try:
        from triton.runtime.cache import triton_key
    except ImportError:
        return None
    before = fingerprint()
    value = triton_key()
    from ember import diskcache
    if before is not None and fingerprint() == before:
        path, root = _path(before)
        diskcache.write_entry(path, root, KIND, before, value.encode())
    return value


def worker_args() -> list:
    """The build worker's command-line arguments: the installed key, if any (else it hashes itself)."""
    return ["--triton-key", _INSTALLED] if _INSTALLED else []
