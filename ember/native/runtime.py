"""What generated wrappers import at run time (kept small: it is on every warm start's path)."""
from __future__ import annotations

import os

from ember.native.cache import load_module


def load_kernel(path: str, name: str):
    """The ``@triton.jit`` function ``name`` of the kernel module at ``path``."""
    return getattr(load_module(path), name)


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


class Launch:
    """``kernel[grid](*args, **meta)`` for one launch site, with Triton's per-call work done once.

    ``JITFunction.run`` binds arguments, computes the specialization key and looks the compiled
    kernel up on every call (~15-20 us of CPU). Shapes are static here, so after the first call we
    keep the compiled kernel and call its launcher directly, with everything but the arguments and
    the current stream packed into one tuple. The one thing that can still change is pointer
    alignment (Triton specializes on 16-byte divisibility): it is checked per call for the pointers
    that may move (``fresh`` lists the positions of buffers the wrapper itself allocated, which are
    always aligned), and a mismatch takes the normal path. Under the interpreter, or when launch hooks
    (profilers) are set at the first call, every call takes the normal path.
    """
    __slots__ = ("fn", "grid", "meta", "fresh", "fast", "direct", "spec")

    def __init__(self, fn, grid, meta, fresh=(), spec=None):
        self.fn, self.grid, self.meta = fn, tuple(grid) + (1,) * (3 - len(grid)), meta
        self.fresh = frozenset(fresh)
        # the arguments' shape for a build ahead of the first call (``precompile``): a torch dtype per
        # pointer, the value of each int (Triton specializes on ints); None: built at the first call
        self.spec = spec
        self.fast = None
        self.direct = True  # may call Triton's C launcher itself (see _direct_launcher)

    def __call__(self, *args):
        fast = self.fast
        if fast is None:
            return self._first(args)
        launch, g0, g1, g2, stream, device, function, extra, checks, consts = fast
        for i, aligned in checks:
            if ((args[i].data_ptr() & 15) == 0) is not aligned:
                return self._slow(args)
        try:
            launch(g0, g1, g2, stream(device), function, *extra, *args, *consts)
        except TypeError:  # the launcher rejected the arguments before launching: Triton's own path
            self.fast, self.direct = None, False
            return self._slow(args)
        return None

    def _slow(self, args):
        return self.fn[self.grid](*args, **self.meta)

    def _first(self, args):
        kernel = self._slow(args)
        try:
            from triton import knobs
            from triton.runtime import driver
            if (kernel is None or not hasattr(kernel, "packed_metadata") or _hook_set(knobs.runtime.launch_enter_hook)
                    or _hook_set(knobs.runtime.launch_exit_hook)):
                return None
            names = self.fn.arg_names
            consts = tuple(self.meta[n] for n in names[len(args):])
            checks = tuple((i, (a.data_ptr() & 15) == 0) for i, a in enumerate(args)
                           if hasattr(a, "data_ptr") and i not in self.fresh)
            active = driver.active
            g = self.grid
            launch, extra = (_direct_launcher(kernel.run, kernel.packed_metadata) if self.direct
                             else (kernel.run, (kernel.packed_metadata, None, None, None)))
            self.fast = (launch, g[0], g[1], g[2], active.get_current_stream, active.get_current_device(),
                         kernel.function, extra, checks, consts)
        except Exception:  # any surprise in Triton's internals: keep the normal path
            self.fast = None
        return None


_TRITON_KEY = None  # the thread computing triton_key(), once started


def prewarm_triton_key() -> None:
    """Compute Triton's cache key in a daemon thread (once per process). Triton is imported here, in
    the calling thread, so the two threads never import at once; hashing releases the GIL."""
    global _TRITON_KEY
    if _TRITON_KEY is not None or os.environ.get("TRITON_INTERPRET", "0") == "1":
        return
    try:
        from triton.runtime.cache import triton_key
    except ImportError:
        _TRITON_KEY = False
        return
    import threading
    _TRITON_KEY = threading.Thread(target=triton_key, name="ember-triton-key", daemon=True)
    _TRITON_KEY.start()


def precompile(launches, threads: int) -> int:
    """Build the kernels of ``launches`` before their first call, ``threads`` builds at a time.

    Triton's ``AsyncCompileMode`` runs each ``warmup`` build in the pool; its MLIR and LLVM passes
    release the GIL and ``ptxas`` is a subprocess, so builds overlap. The binaries land in each
    function's in-memory cache (and Triton's disk cache) under the key of a call with aligned
    pointers and the same ints, which the first real call then finds. A launch whose inputs turn out
    misaligned builds its own variant at that call, as before. A failed build is left for the first
    call to report, with Triton's own error. Returns the number of builds submitted."""
    if _TRITON_KEY:
        _TRITON_KEY.join()  # (rather than hash everything a second time at the first build)
    todo = [site for site in launches if site.spec is not None and site.fast is None]
    if threads <= 1 or len(todo) < 2:
        return 0
    try:
        from triton import AsyncCompileMode
    except ImportError:  # Triton before 3.5: every kernel builds at its first call
        return 0
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(min(threads, len(todo)), thread_name_prefix="ember-triton") as pool, \
            AsyncCompileMode(pool, ignore_errors=True):
        for site in todo:
            try:
                site.fn.warmup(*site.spec, grid=site.grid, **site.meta)
            except Exception:  # noqa: BLE001 - the first call builds it and raises Triton's error there
                pass
    return len(todo)
