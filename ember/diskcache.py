"""The trust policy of every on-disk cache ember keeps (``aot``, ``native``, ``openvino``): one place.

A cache entry is code or data that ember will run or compute with, so a file that someone else could
have written is never read. The rules:

* Directories ember creates get mode 0700. Before a cache reads or writes under a directory, every
  level from the cache's root down to it must be owned by the current user and not writable by group
  or others; otherwise the cache is refused: a warning (once per directory and problem) names the
  path, the problem and the fix, and the caller runs without that cache. Nothing here raises into a
  user's call.
* A file is read only through an open descriptor whose ``fstat`` shows a regular file owned by us and
  not writable by group or others (no check-then-open race).
* Data entries are wrapped in an envelope: one header line ``EMBER-CACHE/1 <kind> <key> <sha256>
  <length>`` before the payload. ``key`` is the hash of everything the entry was built from (what the
  cache's key function hashes), so an entry copied under another key is detected; the checksum and
  length detect a truncated or corrupt payload. A bad entry is a miss (logged once per cause); the
  caller rebuilds it and ``atomic_write`` replaces it.
* Generated Python source (the native backend's wrappers and kernels) is imported only from bytes
  whose SHA-256 matches the digest recorded when it was written, and it is executed from those very
  bytes (never re-read, never through a ``__pycache__`` .pyc). Their code objects may be kept, as
  data entries whose key is the SHA-256 of those bytes (``compile_cached``): a warm process skips
  compiling them again and still runs nothing but the code of the verified bytes.

The envelope proves integrity, not authorship: anyone who can write the directory as us can forge it,
which is why the ownership and mode checks come first.

This module imports nothing of ember at import time (the native build worker loads it by path, as it
loads ``triton_helpers``, without importing the ``ember`` package).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import sys
import tempfile

MAGIC = b"EMBER-CACHE/1"
DIR_MODE = 0o700
_UNSAFE_BITS = stat.S_IWGRP | stat.S_IWOTH
_WARNED: set = set()
_SCRATCH: dict = {}
log = logging.getLogger("ember.cache")


class Refused(Exception):
    """An entry or file not to trust; the message says why (a miss for the caller)."""


def warn_once(what: str, path: str, problem: str, fix: str) -> None:
    """One warning per (path, problem) for the process's lifetime."""
    if (path, problem) in _WARNED:
        return
    _WARNED.add((path, problem))
    log.warning(f"ember cache: {what} {path}: {problem}; {fix}")


# ------------------------------------------------------------------------------------ ownership/mode

def stat_problem(st: os.stat_result, want_dir: bool) -> str | None:
    """Why a file or directory with this ``stat`` must not be trusted, or None."""
    if want_dir and not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if not want_dir and not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"is owned by uid {st.st_uid}, not by the current user (uid {os.getuid()})"
    if st.st_mode & _UNSAFE_BITS:
        return f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _levels(path: str, root: str) -> list[str]:
    """``root`` and every directory below it down to ``path`` (``path`` must be under ``root``)."""
    path, root = os.path.abspath(path), os.path.abspath(root)
    rel = os.path.relpath(path, root)
    if rel == ".":
        return [root]
    if rel.startswith(".."):
        raise ValueError(f"{path} is not under the cache root {root}")
    out = [root]
    for part in rel.split(os.sep):
        out.append(os.path.join(out[-1], part))
    return out


def _mkdir(path: str) -> None:
    """Create ``path`` and missing parents with mode 0700 (``os.makedirs`` gives parents the umask's mode)."""
    parent = os.path.dirname(path)
    if parent != path and not os.path.isdir(parent):
        _mkdir(parent)
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        return
    os.chmod(path, DIR_MODE)  # (a umask such as 0o277 would strip bits 0700 needs)


def dir_problem(path: str, root: str, create: bool = True) -> tuple[str, str, bool] | None:
    """(level, problem, mode_or_owner) for the first level from ``root`` down to ``path`` that must
    not be trusted (not ours, writable by group or others, not a directory, or not creatable), or
    None when every existing level is fine. ``mode_or_owner`` is False for an OSError (no chmod
    fixes that). ``create``: make missing levels (mode 0700); else a missing level ends the walk
    (there is nothing below it to read). Warns nothing: each caller names its own fix."""
    try:
        for level in _levels(path, root):
            if not os.path.lexists(level):
                if not create:
                    return None
                _mkdir(level)
            problem = stat_problem(os.stat(level), want_dir=True)
            if problem is not None:
                return level, problem, True
    except (OSError, ValueError) as e:
        return path, f"{type(e).__name__}: {e}", False
    return None


def secure_dir(path: str, root: str, create: bool = True) -> bool:
    """Make sure ``path`` exists under ``root`` (``create=False``: a missing level is fine, there is
    nothing to read) and that every existing level from ``root`` down is ours and not writable by
    group or others. False (after one warning) when the cache must not be used."""
    found = dir_problem(path, root, create)
    if found is None:
        return True
    level, problem, mode_or_owner = found
    if mode_or_owner:
        fix = "`chown $USER` it and `chmod 700` it, or point EMBER_CACHE_DIR (config.cache_dir) at a directory of your own"
    else:
        fix = "point EMBER_CACHE_DIR (config.cache_dir) at a writable directory of your own"
    warn_once("not using the cache directory", level, problem, "ember runs without this cache; fix: " + fix)
    return False


def scratch_dir(name: str) -> str:
    """A private directory for this process (mode 0700, removed at exit): where a cache that must
    write files (the native backend imports its generated modules from files) works when its
    configured directory is refused."""
    path = _SCRATCH.get(name)
    if path is None:
        import atexit
        import shutil
        path = _SCRATCH[name] = tempfile.mkdtemp(prefix=f"ember-{name}-")
        atexit.register(shutil.rmtree, path, True)
    return path


# ------------------------------------------------------------------------------------------- files

def read_file(path: str) -> bytes | None:
    """The bytes of ``path`` if it is a regular file we own and others cannot write; None when it
    does not exist; raises Refused otherwise."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as e:  # (ELOOP: a symbolic link)
        raise Refused(f"cannot be opened safely ({type(e).__name__}: {e})") from None
    with os.fdopen(fd, "rb") as f:
        problem = stat_problem(os.fstat(fd), want_dir=False)
        if problem is not None:
            raise Refused(problem)
        return f.read()


def atomic_write(path: str, data: bytes) -> None:
    """Write a temporary file (mode 0600) in ``path``'s directory, then rename it over ``path``: a
    reader sees the old file or the new one, and a foreign or corrupt file there is replaced."""
    folder = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def hash_sources(h, folder: str, recursive: bool = False) -> None:
    """Feed hash ``h`` the name and bytes of every ``.py`` file in ``folder`` (and, ``recursive``, below
    it), in sorted order: a cache's fingerprint of the code that builds its entries, so that editing
    that code makes every old entry a miss."""
    walk = sorted(os.walk(folder)) if recursive else [(folder, [], os.listdir(folder))]
    for d, _, files in walk:
        for name in sorted(files):
            if name.endswith(".py"):
                with open(os.path.join(d, name), "rb") as f:
                    h.update(name.encode() + f.read())


# ---------------------------------------------------------------------------------------- envelope

def pack(kind: str, key: str, payload: bytes) -> bytes:
    """``payload`` with its header: what it is, the key it was built for, its checksum and length."""
    return b"%s %s %s %s %d\n" % (MAGIC, kind.encode(), key.encode(), sha256(payload).encode(), len(payload)) + payload


def unpack(data: bytes, kind: str, key: str) -> bytes:
    """The payload of an envelope made by ``pack(kind, key, ...)``; raises Refused (the cause) otherwise."""
    head, nl, payload = data.partition(b"\n")
    parts = head.split(b" ")
    if not nl or len(parts) != 5 or parts[0] != MAGIC:
        raise Refused("not an ember cache entry (no header; corrupt, foreign, or written by an older ember)")
    if parts[1].decode(errors="replace") != kind:
        raise Refused(f"is a {parts[1].decode(errors='replace')!r} entry, not a {kind!r} one")
    stored_key = parts[2].decode(errors="replace")
    if stored_key != key:
        raise Refused(f"was built for key {stored_key[:16]}..., not for {key[:16]}... (an entry stored under another "
                      "key's name)")
    if not parts[4].isdigit() or int(parts[4]) != len(payload):
        said = parts[4].decode(errors="replace")
        raise Refused(f"is truncated or padded ({len(payload)} payload bytes, header says {said})")
    if sha256(payload).encode() != parts[3]:
        raise Refused("fails its checksum (corrupt)")
    return payload


def read_entry(path: str, kind: str, key: str) -> bytes | None:
    """The payload stored at ``path`` for ``key``, or None (missing, or not to trust: logged once per
    cause, so the caller rebuilds the entry and writes it again)."""
    try:
        data = read_file(path)
        return None if data is None else unpack(data, kind, key)
    except Refused as e:
        warn_once(f"ignoring {kind} entry", path, str(e), "it is rebuilt and replaced")
        return None
    except OSError as e:
        warn_once(f"ignoring {kind} entry", path, f"{type(e).__name__}: {e}", "it is rebuilt")
        return None


def read_json(path: str, kind: str, key: str):
    """The JSON value stored at ``path`` for ``key`` (``read_entry``), or None: missing, not to trust,
    or not JSON (an envelope that checks out around text that does not parse is a miss too)."""
    payload = read_entry(path, kind, key)
    try:
        return None if payload is None else json.loads(payload)
    except ValueError:
        return None


def write_entry(path: str, root: str, kind: str, key: str, payload: bytes) -> bool:
    """Store ``payload`` for ``key`` at ``path`` (under the cache root ``root``), atomically; False
    when the directory is refused or the write fails (the cache is an optimization only)."""
    if not secure_dir(os.path.dirname(path), root):
        return False
    try:
        atomic_write(path, pack(kind, key, payload))
    except OSError as e:  # a read-only or full disk: the result was computed anyway
        warn_once("cannot write cache entry", path, f"{type(e).__name__}: {e}", "ember runs without storing it")
        return False
    return True


# ------------------------------------------------------------------------------- generated source

def read_source(path: str, digest: str) -> bytes:
    """The bytes of the generated Python module at ``path``, after checking the file (ours, not
    writable by others, in a directory that is ours and not writable by others) and that its
    SHA-256 is ``digest``; raises Refused."""
    folder = os.path.dirname(os.path.abspath(path))
    problem = stat_problem(os.stat(folder), want_dir=True)
    if problem is not None:
        raise Refused(f"its directory {folder} {problem}")
    data = read_file(path)
    if data is None:
        raise Refused("is missing")
    if sha256(data) != digest:
        raise Refused(f"does not match the SHA-256 recorded when it was generated ({digest[:16]}...)")
    return data


def compile_cached(source: bytes, filename: str, code_path: str | None, root: str | None):
    """``compile(source, filename, "exec")``, the code object kept at ``code_path`` (marshal, in this
    module's envelope) so that a warm process does not compile a big generated module again (the
    frontend's entry functions, the native wrappers: 0.05-0.1 s each for GPT-2). The entry's key is
    the SHA-256 of the source, the file name and the interpreter's bytecode tag, so a stored code
    object is used only for these very bytes (already verified by the caller) under this Python;
    anything else compiles as before. ``code_path`` None: no cache."""
    import marshal
    if isinstance(source, str):
        source = source.encode()
    if code_path is None or root is None:
        return compile(source, filename, "exec", dont_inherit=True)
    key = sha256(source + b"\0" + filename.encode() + b"\0" + (sys.implementation.cache_tag or "").encode())
    trusted = secure_dir(os.path.dirname(code_path), root, create=False)
    payload = read_entry(code_path, _CODE_KIND, key) if trusted else None
    if payload is not None:
        try:
            return marshal.loads(payload)
        except (ValueError, EOFError, TypeError):
            pass
    code = compile(source, filename, "exec", dont_inherit=True)
    write_entry(code_path, root, _CODE_KIND, key, marshal.dumps(code))
    return code


_CODE_KIND = "code"


def code_path_for(path: str) -> str:
    """Where ``compile_cached`` keeps the code object of the generated module at ``path``."""
    return f"{path[:-3] if path.endswith('.py') else path}.{sys.implementation.cache_tag or 'py'}.code"


def exec_source(name: str, path: str, source: bytes):
    """Import ``source`` (already verified) as module ``name`` whose file is ``path``: executed from
    these bytes (their code object kept beside them by ``compile_cached``, never a ``__pycache__`` .pyc)."""
    import importlib.util

    class _Loader:
        def create_module(self, spec):
            return None

        def exec_module(self, module):
            folder = os.path.dirname(path)
            code = compile_cached(source, path, code_path_for(path), folder)
            exec(code, module.__dict__)  # noqa: S102 - verified

    spec = importlib.util.spec_from_file_location(name, path, loader=_Loader())
    mod = importlib.util.module_from_spec(spec)
    mod.__ember_sha256__ = sha256(source)
    sys.modules[name] = mod  # triton.jit reads a kernel's source through its module's file
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return mod
