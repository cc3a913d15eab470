"""Building and loading the C++ kernels of the native backend's CPU path (``cpp_emit``).

One translation unit per graph (``cpp/<hh>/<sha>.cpp``, named by its SHA-256 like the Triton kernel
modules), built by the system compiler into ``cpp/<hh>/<key>.so``, where ``key`` hashes the source,
the compiler's identity (path and ``--version``), the flags and the CPU (``-march=native`` builds for
this machine's features: another CPU must not load it). Trust follows ``ember.diskcache`` (see
docs/guarantees.md): a ``.so`` is code, so it is loaded only if its directory levels are ours with
mode 0700, the file is ours and not writable by others, and its SHA-256 is the one recorded (in an
envelope ``<key>.json``) when this process or an earlier one wrote it. Anything else is rebuilt and
replaced, never loaded. A warm process finds the ``.so`` and loads it without compiling.

Units build in parallel, in the background (``submit``): a build thread per unit runs the compiler
(a process of its own, so threads overlap fully; as many as ``runtime.compile_threads()``, the
setting that sizes the Triton build workers), while this process goes on generating code (a
training step's backward graph while its forward builds). ``library`` waits for a unit's build.
The threads never hold up the process's exit: builds still queued or running then are cancelled
(``build_threads``).

Whether the compiler works is checked once per process, at first use (``problem``): a unit holding
only the prelude and an OpenMP loop, built and loaded through the same cache (so a warm process
compiles nothing for it either). Without a working compiler the CPU path runs the ATen graph, said
once in a warning.

Kernels are called through ctypes with data pointers and int64 sizes. OpenMP regions use
``torch.get_num_threads()`` threads (``sync_threads``, called by each wrapper call).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading

from ember import diskcache
from ember.native import build_threads

FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17",
         # signed overflow wraps (eager's int arithmetic does); errno-free math lets sqrt vectorize.
         # Never -ffast-math: it breaks NaN/Inf semantics (isnan, NaN-propagating max).
         "-fwrapv", "-fno-math-errno",
         # a*b+c as one FMA (ISO C++ mode turns contraction off; eager's vector kernels use FMAs too),
         # and full-width AVX-512 where the CPU has it: softmax 1024x1024, 1 thread, 1.49 -> 1.16 ms
         # on the development VM (gcc defaults to 256-bit vectors)
         "-ffp-contract=fast", "-mprefer-vector-width=512")
# A graph's kernels are split over up to ``runtime.compile_threads()`` translation units that build at
# once (``partition``): each unit pays the compiler's start, the prelude and the link again (~0.05 s
# with g++ 12), so a unit gets at least UNIT_MIN_COST of kernel cost, counted as the kernel's source
# characters plus KERNEL_COST each (a proxy of gcc's -O3 time: ~20 us a character on the development
# VM; the transformer encoder layer's 4 kernels, 0.2 s in one unit, cost ~9000).
UNIT_MIN_COST = 3000
KERNEL_COST = 600
_KIND = "native-cpp-so"
_LIBS: dict = {}       # source path -> ctypes.CDLL
_FUTURES: dict = {}    # source path -> Future of its CDLL, while a build thread loads or builds it
_LOCK = threading.Lock()
BUILDS = {"count": 0, "seconds": 0.0}  # compiler runs in this process (tests, reports)
_THREADS = [0]
_POOL: list = []       # the build threads (build_threads.BuildThreads), once started
_PROBED: dict = {}     # compiler path -> None (works) or why it does not
_WARNED: set = set()   # compiler paths (None: none found) the warning was given for
_PROBE_LOCK = threading.Lock()
_PROBE_STARTED: set = set()  # compiler paths whose check a background thread started (probe_in_background)
_COUNT_LOCK = threading.Lock()
log = logging.getLogger("ember.native")


class CompilerMissing(RuntimeError):
    pass


def find_compiler() -> str:
    """The C++ compiler: ``$CXX``, else ``c++``, else ``g++`` on PATH."""
    from ember.config import environment
    for cand in (environment.get("CXX"), "c++", "g++"):
        if cand:
            path = shutil.which(cand)
            if path:
                return path
    raise CompilerMissing("ember's native CPU path (native_cpu='cpp') needs a C++ compiler with OpenMP: none of "
                          "$CXX, c++, g++ is on PATH. Install g++ (e.g. `apt-get install g++`), or set "
                          "EMBER_NATIVE_CPU=aten to run CPU graphs with ATen")


@functools.lru_cache(maxsize=None)
def compiler_id(cxx: str) -> str:
    """What of the toolchain and machine changes the binary: compiler path and version, flags, and
    the CPU's model and feature flags (for -march=native)."""
    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise CompilerMissing(f"the C++ compiler {cxx} does not run ({e}); install g++ or set EMBER_NATIVE_CPU=aten")
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = "".join(sorted({l for l in f if l.startswith(("model name", "flags"))}))
    except OSError:
        import platform
        cpu = platform.processor() + platform.machine()
    return hashlib.sha256(f"{cxx}|{version}|{' '.join(FLAGS)}|{cpu}".encode()).hexdigest()


def _root(base: str | None) -> str:
    from ember.native import cache
    return cache.root(base)


def write_source(text: str, base: str | None = None) -> str:
    """Store a translation unit under its SHA-256 (kept if already there and intact)."""
    digest = diskcache.sha256(text.encode())
    root = _root(base)
    path = os.path.join(root, "cpp", digest[:2], f"{digest}.cpp")
    try:
        if diskcache.read_source(path, digest) == text.encode():
            return path
    except (diskcache.Refused, OSError):
        pass
    if not diskcache.secure_dir(os.path.dirname(path), root):
        root = diskcache.scratch_dir("native")
        path = os.path.join(root, "cpp", digest[:2], f"{digest}.cpp")
        diskcache.secure_dir(os.path.dirname(path), root)
    diskcache.atomic_write(path, text.encode())
    return path


def partition(sizes: list, ways: int) -> list:
    """The kernels (their source sizes) grouped into translation units that build in parallel: as
    many as ``ways`` and UNIT_MIN_COST allow, longest kernel first into the lightest unit (each group
    keeps the kernels' order; deterministic, so a warm process finds the same units)."""
    costs = [n + KERNEL_COST for n in sizes]
    n = max(1, min(ways, len(costs), sum(costs) // UNIT_MIN_COST))
    groups, load = [[] for _ in range(n)], [0] * n
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        j = load.index(min(load))
        groups[j].append(i)
        load[j] += costs[i]
    return [sorted(g) for g in groups if g]


def _executor():
    if not _POOL:
        from ember.native.runtime import compile_threads
        _POOL.append(build_threads.start(compile_threads(), "ember-cpp-build"))
    return _POOL[0]


def _after_fork_in_child():
    """A forked child has none of the parent's build threads (a task queued on the inherited pool
    would wait forever) and may have a lock a parent's thread held: start afresh."""
    global _LOCK, _PROBE_LOCK, _COUNT_LOCK
    _LOCK, _PROBE_LOCK, _COUNT_LOCK = threading.Lock(), threading.Lock(), threading.Lock()
    _POOL.clear()
    _PROBE_STARTED.clear()  # (a parent's probe thread is not in the child: problem() checks here itself)
    _FUTURES.clear()  # (their builds ran in the parent's threads: library() submits them again)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def submit(path: str) -> None:
    """Start loading (warm) or building (cold) the translation unit at ``path`` in a build thread and
    return at once; ``library`` waits for it. Several units build at the same time."""
    with _LOCK:
        if path not in _LIBS and path not in _FUTURES:
            _FUTURES[path] = _executor().submit(_load_or_build, path)


def library(path: str) -> ctypes.CDLL:
    """The built library of the translation unit at ``path`` (its file name is its SHA-256), waiting
    for its build thread; raises what the build raised (and a later call tries again)."""
    lib = _LIBS.get(path)
    if lib is not None:
        return lib
    submit(path)
    fut = _FUTURES.get(path)
    try:
        built = fut.result() if fut is not None else None
    finally:
        with _LOCK:
            if _FUTURES.get(path) is fut:
                del _FUTURES[path]
    with _LOCK:
        lib = _LIBS.get(path)
        if lib is None:
            lib = _LIBS[path] = built if built is not None else _load_or_build(path)
            lib.ember_set_num_threads.argtypes = [ctypes.c_int]
            lib.ember_take_error.restype = ctypes.c_int
            _THREADS[0] = 0  # set on the next sync_threads
    return lib


def register_prebuilt(path: str, so: str) -> None:
    """Use the library at ``so`` as the build of the translation unit at ``path`` (an AOT package's
    ``.so``, built by ``aot_compile`` on a machine with this CPU's features: ``aot_runtime`` checks
    that). Nothing is compiled and no compiler need exist; the package's loader wrote both files
    into a private folder of its own."""
    with _LOCK:
        lib = _LIBS[path] = ctypes.CDLL(so)
        lib.ember_set_num_threads.argtypes = [ctypes.c_int]
        lib.ember_take_error.restype = ctypes.c_int
        _THREADS[0] = 0  # set on the next sync_threads


_PROBE = r"""
// ember: does this compiler build the prelude and an OpenMP loop, and does the result load?
extern "C" long ember_probe(long n) {
  long s = 0;
#pragma omp parallel for reduction(+ : s) num_threads(ember_threads)
  for (long i = 0; i < n; i++) s += i;
  return s;
}
"""


def problem(base: str | None = None, wait: bool = True) -> str | None:
    """None when the C++ compiler builds and loads ember's kernels on this machine, else why not
    (and a warning, once per process, that CPU graphs run with ATen instead). Checked once per
    compiler and process by building a small unit through the disk cache. ``wait=False``: what is
    known now, without waiting for the check (started in the background if it was not): None while
    it runs. The C++ path goes ahead on that answer (tracing and generating its graph overlap the
    check, 0.1-0.2 s of a cold process) and ``cpp_graph`` asks again, waiting, before the first call."""
    try:
        cxx = find_compiler()
    except CompilerMissing as e:
        return _report(None, str(e))
    if cxx in _PROBED:
        return _PROBED[cxx]
    if not wait:
        probe_in_background(base)
        return None
    with _PROBE_LOCK:
        if cxx not in _PROBED:
            from ember.native.cpp_emit import translation_unit
            why = None
            try:
                path = write_source(translation_unit([]) + _PROBE, base)
                lib = _load_or_build(path)  # (not library(): its cache is by unit, this checks the compiler)
                lib.ember_probe.argtypes, lib.ember_probe.restype = [ctypes.c_long], ctypes.c_long
                if lib.ember_probe(1000) != 499500:
                    why = f"the probe kernel built by {cxx} computed a wrong sum"
            except (RuntimeError, OSError, diskcache.Refused) as e:
                why = f"{type(e).__name__}: {str(e)[:1500]}"
            _PROBED[cxx] = _report(cxx, why)
    return _PROBED[cxx]


def probe_in_background(base: str | None = None) -> None:
    """Start ``problem()``'s compiler check in a daemon thread (the ember backend's ``prewarm_trace``,
    when the frontend starts tracing a frame; ``problem(wait=False)``): with a cold disk cache the
    check is a compiler run (~0.1 s), which this way overlaps the frontend's and the AOT trace and
    the code generation of the first CPU graph. ``problem()`` waits for it (the probe lock) and says
    the same."""
    try:
        cxx = find_compiler()
    except CompilerMissing:
        return  # (problem() reports it, at the first CPU graph)
    with _LOCK:
        if cxx in _PROBED or cxx in _PROBE_STARTED:
            return
        _PROBE_STARTED.add(cxx)
    threading.Thread(target=problem, args=(base,), name="ember-cpp-probe", daemon=True).start()


def _report(cxx, why):
    if why is not None and cxx not in _WARNED:
        _WARNED.add(cxx)
        log.warning("ember: the native backend's C++ path for CPU tensors is off in this process: %s. CPU graphs "
                    "run their ATen ops (eager's kernels) instead. Install g++ (or point $CXX at a compiler with "
                    "OpenMP), or set EMBER_NATIVE_CPU=aten to choose that path and silence this.", why)
    return why


def binary_paths(path: str, source: bytes | None = None) -> tuple:
    """(key, .so path, record path) of the translation unit at ``path`` for this compiler and CPU."""
    if source is None:
        source = diskcache.read_source(path, os.path.basename(path)[:-4])
    key = hashlib.sha256(source + compiler_id(find_compiler()).encode()).hexdigest()
    folder = os.path.dirname(path)
    return key, os.path.join(folder, f"{key}.so"), os.path.join(folder, f"{key}.json")


def _load_or_build(path: str) -> ctypes.CDLL:
    digest = os.path.basename(path)[:-4]
    source = diskcache.read_source(path, digest)  # raises Refused: a source not to trust is not built
    cxx = find_compiler()
    key, so, record = binary_paths(path, source)
    folder = os.path.dirname(path)
    recorded = diskcache.read_entry(record, _KIND, key)
    if recorded is not None and os.path.lexists(so):
        try:
            diskcache.read_source(so, recorded.decode())  # ours, not writable by others, digest matches
            return ctypes.CDLL(so)
        except diskcache.Refused as e:
            diskcache.warn_once("not loading compiled kernels", so, str(e), "they are rebuilt and replaced")
    data = _compile(cxx, source)
    diskcache.atomic_write(so, data)
    diskcache.write_entry(record, folder, _KIND, key, diskcache.sha256(data).encode())
    diskcache.read_source(so, diskcache.sha256(data))  # what is loaded is what was just written
    return ctypes.CDLL(so)


def _compile(cxx: str, source: bytes) -> bytes:
    import time
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ember-cpp-") as tmp:
        src, out = os.path.join(tmp, "k.cpp"), os.path.join(tmp, "k.so")
        with open(src, "wb") as f:
            f.write(source)
        cmd = [cxx, *FLAGS, src, "-o", out]
        # in a build thread: through the pool, which kills the compiler if the process exits meanwhile
        proc = _POOL[0].run(cmd) if _POOL and threading.current_thread() in _POOL[0].threads else \
            subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{cxx} failed to build ember's generated kernels ({src}):\n{proc.stderr[-4000:]}")
        with open(out, "rb") as f:
            data = f.read()
    with _COUNT_LOCK:  # (build threads)
        BUILDS["count"] += 1
        BUILDS["seconds"] += time.perf_counter() - t0
    return data


def load_kernel(path: str, name: str, npointers: int, nsizes: int):
    """Kernel ``name`` of the translation unit at ``path``, as a ctypes function."""
    fn = getattr(library(path), name)
    fn.argtypes = [ctypes.c_void_p] * npointers + [ctypes.c_int64] * nsizes
    fn.restype = None
    return fn


def sync_threads():
    """Give the kernels' OpenMP regions torch's thread count (torch.set_num_threads)."""
    import torch
    n = torch.get_num_threads()
    if n != _THREADS[0]:
        for lib in list(_LIBS.values()):
            lib.ember_set_num_threads(n)
        _THREADS[0] = n


ERRORS = {1: (IndexError, "index out of range (a gather, index or embedding read past its tensor)"),
          2: (RuntimeError, "ZeroDivisionError (integer division or remainder by zero)")}


def check(path: str, name: str):
    """Raise what a kernel of the unit at ``path`` recorded (PRELUDE's ember_fail), as eager raises."""
    code = _LIBS[path].ember_take_error()
    if code:
        cls, what = ERRORS.get(code, (RuntimeError, f"error {code}"))
        raise cls(f"{what}, in ember's C++ kernel {name}")
