"""What generated wrappers import at run time (kept small: it is on every warm start's path)."""
from __future__ import annotations

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


class Launch:
    """``kernel[grid](*args, **meta)`` for one launch site, with Triton's per-call work done once.

    ``JITFunction.run`` binds arguments, computes the specialization key and looks the compiled
    kernel up on every call (~15-20 us of CPU). Shapes are static here, so after the first call we
    keep the compiled kernel and call its launcher directly. The one thing that can still change is
    pointer alignment (Triton specializes on 16-byte divisibility): it is checked per call and a
    mismatch takes the normal path. Under the interpreter, or when launch hooks (profilers) are set
    at the first call, every call takes the normal path.
    """
    __slots__ = ("fn", "grid", "meta", "consts", "fast", "aligned", "ptrs", "stream", "device")

    def __init__(self, fn, grid, meta):
        self.fn, self.grid, self.meta = fn, tuple(grid) + (1,) * (3 - len(grid)), meta
        self.fast = None

    def __call__(self, *args):
        fast = self.fast
        if fast is not None:
            for i, a in zip(self.ptrs, self.aligned):
                if (args[i].data_ptr() % 16 == 0) != a:
                    return self._slow(args)
            g = self.grid
            fast[0](g[0], g[1], g[2], self.stream(self.device), fast[1], fast[2], None, None, None, *args, *self.consts)
            return None
        return self._first(args)

    def _slow(self, args):
        return self.fn[self.grid](*args, **self.meta)

    def _first(self, args):
        kernel = self._slow(args)
        try:
            from triton import knobs
            from triton.runtime import driver
            if (kernel is None or not hasattr(kernel, "packed_metadata") or knobs.runtime.launch_enter_hook is not None
                    or knobs.runtime.launch_exit_hook is not None):
                return None
            names = self.fn.arg_names
            self.consts = tuple(self.meta[n] for n in names[len(args):])
            self.ptrs = tuple(i for i, a in enumerate(args) if hasattr(a, "data_ptr"))
            self.aligned = tuple(args[i].data_ptr() % 16 == 0 for i in self.ptrs)
            self.device = driver.active.get_current_device()
            self.stream = driver.active.get_current_stream
            self.fast = (kernel.run, kernel.function, kernel.packed_metadata)
        except Exception:  # any surprise in Triton's internals: keep the normal path
            self.fast = None
        return None
