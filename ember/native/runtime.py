"""What generated wrappers import at run time (kept small: it is on every warm start's path)."""
from __future__ import annotations

import contextlib
import os
from concurrent.futures import ThreadPoolExecutor

from ember.native.cache import load_module, loaded_module, verified_source
from ember.config import environment

# Launch sites of this process: ``first`` first calls, ``fast``/``direct`` of them got the per-call fast
# path / call Triton's C launcher directly, ``no_fast`` did not (interpreter, launch hooks, a surprise in
# Triton's internals); ``slow_calls``: later calls that took Triton's normal path (~15-20 us of CPU each:
# a pointer that lost its alignment, or a site without a fast path). A warm process must count the same
# as the process that compiled (benchmarks/probes/warm_decisions.py prints them).
STATS = {"first": 0, "fast": 0, "direct": 0, "no_fast": 0, "slow_calls": 0, "built_here": 0}


def load_kernel(path: str, name: str):
    """The ``@triton.jit`` function ``name`` of the kernel module at ``path``, imported at its first use
    (``KernelRef``)."""
    return KernelRef(path, name)


class KernelRef:
    """A wrapper's reference to the ``@triton.jit`` function ``name`` of the kernel module at ``path``,
    whose module is imported when something first reads the function (a launch through Triton's JIT,
    a build ahead, any attribute). Why: a warm start whose launch sites take their recorded binaries
    (``warm_launch.adopt``, which sets ``arg_names`` from the record: the one thing ``Launch.adopt``
    reads of the function) never needs it, and importing each kernel module (``triton.jit`` reads the
    source back through ``inspect``) was 0.08 s of GPT-2 training's warm first call on the H100 (44
    modules). The file is still checked now, with the wrapper (``cache.verified_source``: a kernel
    edited on disk makes the wrapper's load fail, so the graph is generated again), and the module is
    executed later from the bytes checked here."""

    __slots__ = ("path", "name", "_fn", "_source", "arg_names")

    def __init__(self, path: str, name: str):
        self.path, self.name, self._fn, self._source = path, name, None, None
        mod = loaded_module(path)
        if mod is not None:
            self._fn = getattr(mod, name)
        else:
            self._source = verified_source(path)  # (raises diskcache.Refused)

    def load(self):
        fn = self._fn
        if fn is None:
            fn = self._fn = getattr(load_module(self.path, source=self._source), self.name)
            self._source = None
        return fn

    def __getitem__(self, grid):
        return self.load()[grid]

    def __getattr__(self, attr):  # (an attribute not set here: the function's)
        if attr.startswith("__"):  # (copy, pickle and the like ask the reference, not the function)
            raise AttributeError(attr)
        return getattr(self.load(), attr)

    def __repr__(self) -> str:
        return f"KernelRef({self.path!r}, {self.name!r}{', loaded' if self._fn is not None else ''})"


def fixed_layout(t, size, stride):
    """An extern op's result with the strides the kernels were compiled for. Ops may lay their
    output out differently than at trace time (e.g. channels-last propagation); copy then.
    None passes through: flash attention returns undefined tensors where its meta function
    returns empty ones (seen on H100 for the philox state)."""
    if t is None or t.stride() == stride:
        return t
    import torch
    return torch.empty_strided(size, stride, dtype=t.dtype, device=t.device).copy_(t)


def _hook_set(hook) -> bool:
    """Triton 3.6 keeps launch hooks in a ``HookChain`` that exists even when empty (older versions
    used None): only a chain with hooks in it needs the normal launch path."""
    return hook is not None and bool(getattr(hook, "calls", True))


def _direct_launcher(run, packed):
    """(callable, arguments between ``function`` and the kernel's own) for a launch. Triton 3.x's
    ``CudaLauncher.__call__`` is a Python frame that only allocates scratch memory (none for our
    kernels: no tensor descriptors, no profiling) before calling the compiled C ``launch``; calling
    that directly saves that frame on every launch (about 2 us each under cProfile in a ResNet-50
    training step, which has ~850 launches). A
    launcher that needs scratch memory, or of another shape, keeps ``run``; a ``TypeError`` from the
    direct call (raised while parsing arguments, before any launch) switches back to Triton's path."""
    launch = getattr(run, "launch", None)
    if (callable(launch) and getattr(run, "global_scratch_size", 1) == 0 and getattr(run, "profile_scratch_size", 1) == 0
            and hasattr(run, "launch_cooperative_grid") and hasattr(run, "launch_pdl")):
        # launch_cooperative_grid, launch_pdl, global_scratch, profile_scratch, kernel metadata,
        # launch metadata, enter hook, exit hook (hooks set later are not seen, as on the fast path)
        return launch, (run.launch_cooperative_grid, run.launch_pdl, None, None, packed, None, None, None)
    return run, (packed, None, None, None)


# Per-call fast functions of launch sites, generated once per shape of call (number of arguments, the
# alignment checks, how many fixed launcher arguments and constexprs): the factory's source -> its
# factory (compiled here, or from the code objects a graph's launch record keeps: ``prime_factories``)
_FAST_FACTORIES: dict = {}
# the same factories by the shape of call they were made for (what ``_fast_source`` is a function of):
# a site finds its factory without spelling the source (GPT-2 training's warm start adopts 377 sites)
_FAST_BY_SHAPE: dict = {}


# Pass the kernel's tensors to Triton's C launcher as their addresses (ints): for a tensor the launcher
# calls ``data_ptr()`` and then the driver's ``cuPointerGetAttribute`` per pointer, only to check that
# the memory is the device's (a CPU tensor raises there); an int goes through as it is. The wrapper's
# tensors are the device's by construction (the entry's guards check every input's device, the
# wrapper allocates the rest on it), so the check is paid for nothing on every launch. False: pass
# the tensors (Triton's own way).
RAW_POINTERS = True


def _fast_source(nargs, checks, n_extra: int, n_consts: int, pointers=frozenset()) -> str:
    """The source of a factory ``make(site, launch, g0, g1, g2, stream, device, function, extra, consts)``
    returning a launch site's ``run``. ``nargs`` None: any number of arguments (``*args``), passed on
    as they are; else ``pointers`` are the positions of tensors, passed as their addresses."""
    params = [f"a{i}" for i in range(nargs)] if nargs is not None else None
    arg = (lambda i: params[i]) if params is not None else (lambda i: f"args[{i}]")
    pack = f"({', '.join(params)}{',' if len(params) == 1 else ''})" if params is not None else "args"
    extra = [f"e{i}" for i in range(n_extra)]
    consts = [f"c{i}" for i in range(n_consts)]
    lines = ["def make(site, launch, g0, g1, g2, stream, device, function, extra, consts):"]
    if extra:
        lines.append(f"    {', '.join(extra)}, = extra")
    if consts:
        lines.append(f"    {', '.join(consts)}, = consts")
    lines.append(f"    def run({', '.join(params) if params is not None else '*args'}):")
    passed = list(params) if params is not None else ["*args"]
    for i, aligned in checks:
        # (Triton specialized the kernel on this pointer's 16-byte alignment at the first call)
        if params is not None and i in pointers:
            lines.append(f"        p{i} = {arg(i)}.data_ptr()")
            ptr, passed[i] = f"p{i}", f"p{i}"
        else:
            ptr = f"{arg(i)}.data_ptr()"
        test = f"{ptr} & 15" if aligned else f"not ({ptr} & 15)"
        lines += [f"        if {test}:  # argument {i} was {'' if aligned else 'not '}16-byte aligned",
                  f"            return site._misaligned({pack})"]
    if params is not None:
        for i in sorted(pointers):
            if i < nargs and passed[i] == params[i]:  # (a buffer of the wrapper's own: not checked)
                passed[i] = f"{params[i]}.data_ptr()"
    call_args = ["g0", "g1", "g2", "stream(device)", "function", *extra, *passed, *consts]
    lines += ["        try:",
              f"            launch({', '.join(call_args)})",
              "        except (TypeError, AttributeError):  # rejected while reading the arguments, before launching",
              f"            return site._fast_failed({pack})",
              "    return run"]
    return "\n".join(lines) + "\n"


_FACTORY_FILE = "<ember launch site>"


def _fast_function(site, fast, nargs):
    """``site.run`` for the fast path ``fast`` (see ``Launch.fast``)."""
    launch, g0, g1, g2, stream, device, function, extra, checks, consts = fast
    shape = (nargs, tuple(checks), len(extra), len(consts), site.pointers())
    make = _FAST_BY_SHAPE.get(shape)
    if make is None:
        src = _fast_source(*shape)
        make = _FAST_FACTORIES.get(src)
        if make is None:
            make = _FAST_FACTORIES[src] = _factory(compile(src, _FACTORY_FILE, "exec"))
        _FAST_BY_SHAPE[shape] = make
    return make(site, launch, g0, g1, g2, stream, device, function, tuple(extra), tuple(consts))


def _factory(code):
    ns: dict = {}
    exec(code, ns)  # noqa: S102 - our own generated code (or its code object, stored by us: prime_factories)
    return ns["make"]


def factory_codes(sources) -> dict:
    """{source: code object} of the fast-path factories of ``sources`` (``Launch.fast_source``), for
    ``prime_factories`` in a later process: compiling them was 33 ``compile()`` calls, 0.04 s of
    GPT-2 training's warm first call on the H100."""
    return {src: compile(src, _FACTORY_FILE, "exec") for src in sources if isinstance(src, str)}


def prime_factories(codes: dict) -> None:
    """Take the stored code objects of fast-path factories (``factory_codes``), each under the exact
    source it was compiled from: a site whose factory source is one of them runs it uncompiled; any
    other source compiles as before."""
    for src, code in codes.items():
        if isinstance(src, str) and src not in _FAST_FACTORIES and getattr(code, "co_filename", None) == _FACTORY_FILE:
            _FAST_FACTORIES[src] = _factory(code)


class Launch:
    """``kernel[grid](*args, **meta)`` for one launch site, with Triton's per-call work done once.

    ``JITFunction.run`` binds arguments, computes the specialization key and looks the compiled
    kernel up on every call (~15-20 us of CPU). Shapes are static here, so after the first call we
    keep the compiled kernel and call its launcher directly, with everything but the arguments and
    the current stream bound beforehand. The one thing that can still change is pointer alignment
    (Triton specializes on 16-byte divisibility): it is checked per call for the pointers that may
    move (``fresh`` lists the positions of buffers the wrapper itself allocated, which are always
    aligned), and a mismatch takes the normal path. Under the interpreter, or when launch hooks
    (profilers) are set at the first call, every call takes the normal path.

    Generated wrappers call ``site.run(...)``: a plain function, first the site's first-call path,
    then (``fast`` set) one generated for this site (``fast_source``): the alignment checks
    unrolled, the launcher's fixed arguments bound in its closure, the kernel's arguments passed on
    without building a tuple. Calling the instance (``site(...)``) does the same through one frame
    more.
    """
    __slots__ = ("fn", "grid", "meta", "fresh", "_fast", "direct", "spec", "ahead", "plain", "kernel", "checks",
                 "run", "nargs")

    def __init__(self, fn, grid, meta, fresh=(), spec=None):
        self.fn, self.grid, self.meta = fn, tuple(grid) + (1,) * (3 - len(grid)), meta
        self.fresh = frozenset(fresh)
        # the arguments' shape for a build ahead of the first call (``precompile``): a torch dtype per
        # pointer, the value of each int (Triton specializes on ints); None: built at the first call
        self.spec = spec
        self.direct = True  # may call Triton's C launcher itself (see _direct_launcher)
        self.ahead = None  # the cache hash of the build a worker process did for this site (build_pool)
        self.plain = False  # no fast path for good (launch hooks at the first call): Triton's path, no lock
        self.kernel = self.checks = None  # Triton's CompiledKernel and the alignment checks, once known
        self.nargs = None  # the number of arguments the wrapper passes, once seen
        self.fast = None

    @property
    def fast(self):
        """(launcher, grid x, y, z, stream getter, device, function, launcher's fixed arguments,
        alignment checks, constexpr values), or None before the first call. Setting it (``adopt``,
        or a test's stand-in launcher) makes ``run`` the function generated for it."""
        return self._fast

    @fast.setter
    def fast(self, value):
        self._fast = value
        if value is None:
            self.run = self._first_run
        elif len(value) == 10:
            self.run = _fast_function(self, value, self.nargs)
        else:  # (a placeholder, e.g. a test's "already called once": it is unpacked when called)
            self.run = self._unpacked_run

    def _unpacked_run(self, *args):
        return _fast_function(self, self._fast, None)(*args)

    def __call__(self, *args):
        return self.run(*args)

    @property
    def fast_source(self) -> str | None:
        """The source of the factory that made ``run`` (None before the fast path is taken)."""
        fast = self._fast
        return None if fast is None else _fast_source(self.nargs, fast[8], len(fast[7]), len(fast[9]), self.pointers())

    def pointers(self) -> frozenset:
        """Positions of the arguments the fast path passes as addresses (``RAW_POINTERS``): the
        tensors whose alignment is checked, and the wrapper's own buffers (``fresh``)."""
        if not RAW_POINTERS or self._fast is None:
            return frozenset()
        return frozenset(i for i, _ in self._fast[8]) | self.fresh

    def _first_run(self, *args):
        return self._first(args)

    def _fast_failed(self, args):
        """The launcher rejected the arguments before launching (a TypeError while parsing them):
        Triton's own path, for good."""
        self.fast, self.direct = None, False
        STATS["fast"] -= 1
        STATS["direct"] -= 1
        return self._slow(args)

    def _misaligned(self, args):
        STATS["slow_calls"] += 1
        return self._slow(args)

    def _slow(self, args):
        return self.fn[self.grid](*args, **self.meta)

    def _first(self, args):
        if self.plain:  # (a site without a fast path: no lock, no build wait, no retry)
            STATS["slow_calls"] += 1
            return self._slow(args)
        # Under one lock (ember/locks.py): Triton's JIT compiles into per-device tables, and its
        # interpreter (CPU tests) patches triton.language while a kernel runs, so interpreted launches
        # (which never get a fast path) run one at a time
        from ember.locks import COMPILE_LOCK
        with COMPILE_LOCK:
            return self._first_locked(args)

    def _first_locked(self, args):
        from ember.native import build_pool, triton_cache
        triton_cache.ensure_safe()  # (checked once per process: a set lookup after the first compile)
        build_pool.wait(self)  # (the worker processes' build of it: this one then finds its binary on disk)
        if self.ahead is None:
            self._build_here(args)
        kernel = self._slow(args)
        STATS["first"] += 1
        if self.ahead is not None and getattr(kernel, "hash", self.ahead) != self.ahead:
            build_pool.STATS["key_mismatch"] += 1  # built twice: the worker keyed it differently
        checks = tuple((i, (a.data_ptr() & 15) == 0) for i, a in enumerate(args)
                       if hasattr(a, "data_ptr") and i not in self.fresh)
        self.adopt(kernel, checks, len(args))
        return None

    def _build_here(self, args) -> None:
        """No worker built this kernel (a graph of fewer than ``build_pool.POOL_MIN_KERNELS`` kernels
        found no worker ready): it is compiled here, for these arguments, with its launcher's C module
        compiled beside it (``build_worker._launcher_ahead``: a thread started by the hook Triton calls
        as the build begins), not after it when the first launch creates the launcher. On the H100 a
        one-kernel function's first launch took the kernel's build (0.14 s) and then the launcher's
        (0.30 s): ``small_cold_timeline-h100-s44-lazy-overhead.txt``. Anything unexpected leaves
        the first launch to build both, as before."""
        if environment.triton_interpret or not hasattr(self.fn, "warmup"):
            return
        try:
            from triton import knobs
        except ImportError:
            return
        if knobs.runtime.jit_cache_hook is not None:  # (someone else's hook: left alone)
            return
        from ember.native import build_worker
        prewarm = _DRIVER_PREWARM
        if prewarm and prewarm.is_alive():  # (the driver, which the build reads: not created twice at once)
            prewarm.join()
        early: list = []
        knobs.runtime.jit_cache_hook = build_worker._launcher_ahead(early)
        try:
            self.fn.warmup(*args, grid=self.grid, **self.meta)
        except Exception:  # noqa: BLE001 - the first launch builds it and reports any error
            pass
        finally:
            knobs.runtime.jit_cache_hook = None
        if early:
            early[0].join()
        STATS["built_here"] += 1

    def adopt(self, kernel, checks, nargs: int) -> bool:
        """Take the fast path with ``kernel`` (Triton's CompiledKernel for this site's function and
        meta, specialized for pointers aligned as ``checks`` says), without Triton's JIT: at a
        site's first call, for a new grid of a ``DynamicLaunch``, or for a kernel an AOT package
        loaded from its binary. False (the normal path stays) under launch hooks or the interpreter."""
        try:
            from triton import knobs
            from triton.runtime import driver
            if kernel is None or not hasattr(kernel, "packed_metadata"):
                STATS["no_fast"] += 1
                return False
            if _hook_set(knobs.runtime.launch_enter_hook) or _hook_set(knobs.runtime.launch_exit_hook):
                # (hooks, e.g. a profiler's, set at the first call: Triton's path, which calls them, every time)
                self.plain = True
                STATS["no_fast"] += 1
                return False
            consts = tuple(self.meta[n] for n in self.fn.arg_names[nargs:])
            self.nargs = nargs
            active = driver.active
            g = self.grid
            launch, extra = (_direct_launcher(kernel.run, kernel.packed_metadata) if self.direct
                             else (kernel.run, (kernel.packed_metadata, None, None, None)))
            self.fast = (launch, g[0], g[1], g[2], active.get_current_stream, active.get_current_device(),
                         kernel.function, extra, tuple(checks), consts)
            self.kernel, self.checks = kernel, tuple(checks)
            STATS["fast"] += 1
            STATS["direct"] += launch is not kernel.run
        except Exception:  # any surprise in Triton's internals: keep the normal path
            self.fast = None
            STATS["no_fast"] += 1
            return False
        return True


def compile_threads() -> int:
    """Kernel builds at once (threads, and worker processes): ``config.compile_threads``, or one per
    core up to 16."""
    from ember.config import config
    return config.compile_threads or min(16, os.cpu_count() or 1)


_PREWARM = None  # the thread computing triton_key() (what the first kernel build waits for), once started
_DRIVER_PREWARM = None  # the thread creating Triton's driver (what the first launch waits for), once started
_POOL_WORKERS = 0  # build workers wanted (prewarm_triton), started at the first graph this process generates


def prewarm_triton(pool_workers: int = 0) -> None:
    """Start, once per process, what the first launch of a kernel waits for: Triton's CUDA driver
    (whose C helper module Triton compiles with the system C compiler on a cold cache, 0.3 s), in a
    daemon thread (the compiler subprocess releases the GIL). Triton is imported here, in the
    calling thread, so the two threads never import at once.

    Triton's cache key (``triton_key``: a hash of its sources and of libtriton, 0.4 GB, 0.3-0.4 s
    on the H100 host) is only needed to build a kernel, so it is started by ``prewarm_triton_key``
    when a frame is traced or a graph generated, not here: a warm start, whose kernels all come
    from their recorded binaries, never builds one, and its first call ran beside that hash (the
    thread takes the GIL back some 800 times, once per MiB read and hashed).

    The kernel-build worker processes (``build_pool``, ``pool_workers`` of them) are not started
    here but by ``want_builds``, when the native backend generates a graph: a process whose graphs
    all come from the disk cache (a warm start) has nothing to build, and must not spend its first
    seconds of steady state beside a dozen worker processes importing Triton and hashing its sources."""
    global _DRIVER_PREWARM, _POOL_WORKERS
    _POOL_WORKERS = max(_POOL_WORKERS, pool_workers)
    if _DRIVER_PREWARM is not None or environment.triton_interpret:
        return
    try:
        from triton.runtime import driver
    except ImportError:
        _DRIVER_PREWARM = False
        return
    from ember.native import triton_cache
    triton_cache.ensure_safe()  # (creating the driver loads a C module from Triton's cache)
    import threading

    def work():
        try:
            driver.active  # noqa: B018 - creating it builds (or loads) the C helper module
        except Exception:  # noqa: BLE001 - the first launch meets the same error and reports it
            pass
    _DRIVER_PREWARM = threading.Thread(target=work, name="ember-triton-driver", daemon=True)
    _DRIVER_PREWARM.start()


def prewarm_triton_key() -> None:
    """Start, once per process, Triton's cache key (``triton_key``), which every kernel build waits
    for, in a daemon thread (hashing releases the GIL): when the frontend starts tracing a frame of
    CUDA tensors (``ember_backend``'s ``prewarm_trace``), when the autograd layer or the native
    backend misses its cache (``want_builds``), and when a cached graph's kernels were not all
    recorded (their first launch builds or looks them up through Triton's JIT)."""
    global _PREWARM
    if _PREWARM is not None or environment.triton_interpret:
        return
    try:
        from triton.runtime.cache import triton_key
    except ImportError:
        _PREWARM = False
        return
    import threading

    def work():
        from ember import triton_key as key_process
        if key_process.started():  # (started by import ember: the key hashed in a child process)
            key = key_process.result()
            if key is not None:
                key_process.install(key)
                return
        with _short_switch_interval():
            try:
                triton_key()
            except Exception:  # noqa: BLE001 - the first build meets the same error and reports it
                pass
    _PREWARM = threading.Thread(target=work, name="ember-triton-prewarm", daemon=True)
    _PREWARM.start()


# Python's switch interval while Triton's cache key is hashed beside a trace (``_short_switch_interval``)
HASH_SWITCH_INTERVAL_S = 0.0002


@contextlib.contextmanager
def _short_switch_interval():
    """Triton hashes libtriton (0.4 GB) a MiB at a time, and each MiB's read and hash (which release
    the GIL) end with the thread asking for the GIL back, which the main thread, tracing and
    lowering a graph in Python, hands over only after the switch interval (5 ms by default): 400
    waits. On the H100 host the key, started with the trace, was ready 0.74-0.78 s later, 0.3 s
    after the main thread had gone idle waiting for it (a one-kernel graph's build waits for the
    key). With a short interval the main thread yields within 0.2 ms each time, once per MiB (the
    hashing thread asks for nothing more), and the hash runs beside the trace. Restored when the
    hash is done, unless someone set another interval meanwhile."""
    import sys
    old = sys.getswitchinterval()
    sys.setswitchinterval(min(old, HASH_SWITCH_INTERVAL_S))
    ours = sys.getswitchinterval()  # (as stored: whole microseconds)
    try:
        yield
    finally:
        if sys.getswitchinterval() == ours:
            sys.setswitchinterval(old)


_CUDA_PREWARM = None  # the thread creating the CUDA context and a cuBLAS handle, once started


def prewarm_cuda() -> None:
    """Start, once per process, what the first matmul of a process waits for: loading cuBLAS (its
    library and kernels, 0.1-0.5 s, shared by every thread's handle), in a daemon thread, so that a
    warm start pays it while it loads its caches instead of at its first kernel. Only where the
    caller's thread has CUDA initialized already (a model on the GPU): the thread then works on the
    caller's current device. A thread of its own would otherwise make a context on device 0, memory
    taken from another process's GPU under one-GPU-per-rank training, and torch warns when a thread
    without a current context asks for a handle. (A process that ran eagerly before compiling has
    cuBLAS loaded already; this then costs nothing.)"""
    global _CUDA_PREWARM
    if _CUDA_PREWARM is not None:
        return
    import threading

    import torch
    if not torch.cuda.is_initialized():
        return
    device = torch.cuda.current_device()

    def work():
        try:
            torch.cuda.set_device(device)  # (the caller's device, current in this thread: no new context)
            torch.cuda.current_blas_handle()
        except Exception:  # noqa: BLE001 - the first real call meets the same error and reports it
            pass
    _CUDA_PREWARM = threading.Thread(target=work, name="ember-cuda-prewarm", daemon=True)
    _CUDA_PREWARM.start()


def want_builds() -> None:
    """A graph is about to be traced or generated (an autograd-layer or native-cache miss): start
    Triton's cache key (``prewarm_triton_key``) and the build workers that ``prewarm_triton`` asked
    for (they import Triton while this process lowers and emits the graph)."""
    if environment.triton_interpret:
        return
    prewarm_triton_key()
    if _POOL_WORKERS > 1:
        from ember.native import build_pool
        build_pool.start(_POOL_WORKERS)


def _launcher_first(compile_fn):
    """A build followed by its launcher: the C module Triton otherwise compiles at the kernel's
    first launch (in the caller's thread, one at a time); built here it lands in Triton's cache."""
    def run():
        kernel = compile_fn()
        try:
            from triton.runtime import driver
            driver.active.launcher_cls(kernel.src, kernel.metadata)
        except Exception:  # noqa: BLE001 - the first launch builds it and reports any error
            pass
        return kernel
    return run


class _LauncherFirstExecutor(ThreadPoolExecutor):
    """The thread pool ``AsyncCompileMode`` hands builds to: each build also builds its launcher."""

    def submit(self, fn, /, *args, **kwargs):
        return super().submit(_launcher_first(fn), *args, **kwargs)


def precompile(launches, threads: int) -> int:
    """Build the kernels of ``launches`` before their first call, ``threads`` builds at a time.

    With the worker processes of ``build_pool`` running, the kernels and their launchers are built
    there, truly in parallel and in the background: this returns at once, and each kernel's first
    launch finds its binary in Triton's disk cache. Otherwise they are built here through Triton's
    ``AsyncCompileMode``, each build in a thread pool (where its launcher is built too: a C compiler
    subprocess, so those overlap even when the builds do not). The binaries land in each function's
    in-memory cache under the key of a call with aligned pointers and the same ints, which the first
    real call then finds. A launch whose inputs turn out misaligned builds its own variant at that
    call, as before. A failed build is left for the first call to report, with Triton's own error.
    Returns the number of builds submitted."""
    todo = [site for site in launches if site.spec is not None and site.fast is None]
    if threads <= 1 or not todo:
        return 0
    try:
        from triton import AsyncCompileMode
    except ImportError:  # Triton before 3.5: every kernel builds at its first call
        return 0
    from ember.native import build_pool
    # (not waiting for Triton's cache key first: the pool's requests need it only when sent, from
    # the batch's own thread, while this one goes on; the H100's cold overhead row waited 0.36 s here)
    if build_pool.build_ahead(todo):
        return len(todo)
    if len(todo) < 2:
        return 0
    if _PREWARM:
        _PREWARM.join()  # (rather than hash everything a second time at the first build)
    with _LauncherFirstExecutor(min(threads, len(todo)), thread_name_prefix="ember-triton") as pool, \
            AsyncCompileMode(pool, ignore_errors=True):
        for site in todo:
            try:
                site.fn.warmup(*site.spec, grid=site.grid, **site.meta)
            except Exception:  # noqa: BLE001 - the first call builds it and raises Triton's error there
                pass
    return len(todo)
