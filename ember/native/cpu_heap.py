"""glibc malloc's thresholds for the C++ path (``ember.config.native_cpu_malloc``).

PyTorch's CPU allocator is plain ``posix_memalign``/``free``: a tensor freed by one training step is
given back to glibc, and the next step's tensor of the same size is allocated again. glibc decides
per block whether that memory stays in the process:

* a block above ``M_MMAP_THRESHOLD`` is its own ``mmap`` and goes back to the OS at ``free``;
* heap memory free at the top of the heap beyond ``M_TRIM_THRESHOLD`` is returned with ``brk``.

Either way the next step touches fresh pages: a page fault (and a page zeroed by the kernel) per
4 KiB. glibc's default is dynamic: freeing an mmapped block raises the mmap threshold to that block's
size (at most 32 MiB on 64-bit) and the trim threshold to twice it. For a training step that frees
and reallocates a few MiB of gradients and activations each call, whether the heap top exceeds
twice the largest block at one of the many ``free`` calls depends on the order of allocations, i.e.
on luck: measured on the ``mlp_train`` row of ``benchmarks/cpu_suite.py`` (a 4 MiB and a 2 MiB
weight gradient per step), ember's process paid 110-175 page faults per step (trimmed by a 128 KiB
``free`` inside the forward, ``gdb`` on ``brk``: 10 MiB at a time) and eager's ~0-40 in its own
process but 440 in another heap layout; the faults land inside the weight-gradient ``mm`` writing
its fresh output (the "slower mm" of the profiles). ``benchmarks/probes/cpu_pair_cputime.py`` shows
them per step.

So at its first CPU graph the C++ path fixes both thresholds at the values glibc's own dynamic rule
reaches at its cap (mmap 32 MiB, trim 64 MiB): blocks up to 32 MiB come from the heap, and up to
64 MiB of freed heap stays in the process for the next step instead of being faulted back in. The
cost is that much memory kept mapped after a peak (glibc keeps the same once its rule has capped).
Left alone: off (``EMBER_NATIVE_CPU_MALLOC=0``), not glibc, or malloc tuned by the user already
(``MALLOC_*_`` variables, ``glibc.malloc`` tunables).
"""
from __future__ import annotations

import ctypes

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # (glibc's malloc.h)
MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit: its dynamic rule's cap
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD  # (the dynamic rule's trim threshold: twice the mmap threshold)
USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")

_DONE: list = []  # [outcome]: applied once per process


def _libc():
    """glibc's functions, or None (another libc, or none found)."""
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - glibc only
        return libc
    except (OSError, AttributeError):
        return None


def _user_tuned(get) -> str | None:
    """The user's own malloc setting in the environment (``get``: name -> value or None), or None."""
    for var in USER_SETTINGS:
        if get(var) is not None:
            return var
    if "glibc.malloc." in (get("GLIBC_TUNABLES") or ""):
        return "GLIBC_TUNABLES"
    return None


def keep_freed_memory(enabled: bool, get=None, libc=None) -> str:
    """Set the thresholds once per process (module docstring); returns what was done, for the log.
    ``get``/``libc``: the environment's reader and glibc (tests pass fakes)."""
    if _DONE:
        return _DONE[0]
    if get is None:
        from ember.config import environment
        get = environment.get
    user = _user_tuned(get)
    if not enabled:
        outcome = "left alone (native_cpu_malloc off)"
    elif user:
        outcome = f"left alone ({user} set)"
    else:
        libc = libc if libc is not None else _libc()
        if libc is None:
            outcome = "left alone (not glibc)"
        else:  # mmap first: setting either turns glibc's dynamic rule off
            ok = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
            outcome = (f"mmap threshold {MMAP_THRESHOLD >> 20} MiB, trim threshold {TRIM_THRESHOLD >> 20} MiB" if ok
                       else "mallopt refused the thresholds")
    _DONE.append(outcome)
    return outcome
