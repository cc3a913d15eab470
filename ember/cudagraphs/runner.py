"""``Runner``: a compiled callable that replays CUDA graphs of itself.

Per input signature (shapes, strides, dtypes, non-tensor values) a call goes through

    warm-up (first call: run normally) -> record (second call: capture, replay) -> replay ...

and at each replay the runner checks, cheapest first:

1. the captured signature still fits (copied inputs: shape and dtype; others: see ``Recording``);
2. static inputs are where they were. An input is static when it is a parameter, an output of a graph
   of the same pool, or the very storage the warm-up call got (buffers, or a caller passing the same
   tensor each time). A fresh tensor that the allocator happened to place at the warm-up input's
   freed address is not static: whether that coincidence repeats is up to the allocator, and a
   static input that moves later costs a re-recording (which production turns into disabling). A graph reading an input in place is right as long
   as the input is at the captured address, whatever tensor it belongs to. An input that moves is
   copied from then on (one re-recording), unless it is an output of an upstream graph that ran
   without its graph this once (then this call runs normally too);
3. no output of this or a later capture in the pool is still held (``pool`` docstring): a replay
   would overwrite it. Then this call runs normally, those outputs are copied out from now on, and if
   the same storages are still held at the next call the graph is recorded anew around them.

Anything that cannot be replayed safely runs the compiled function as it is. After ``max_recordings``
recordings, or a failed capture, the runner stops using graphs and logs why.

Threads: every runner call that may use graphs holds one process-wide lock (``_LOCK``). What such a
call touches is shared by all callers and all runners of a device: a replay reads and writes fixed
addresses (placeholders, outputs), the pool's capture sequence and its record of held outputs are
one per device, and ``STATS`` is global. So two threads never replay, capture or check the pool at
the same time; a thread waits for the other's call (a replay is one launch, so the wait is short; a
warm-up, or a call that runs without the graph, waits for the compiled function). Outputs one thread
still holds when another calls are the held outputs of rule 3: that call runs without the graph and
those outputs are copied from then on, so results stay right; a runner whose outputs stay held across
threads may disable itself (logged, ``stats()['disabled']``), never return wrong values. A disabled
runner calls its function without the lock. Recordings are shared, not per thread: capture runs on
the pool's side stream; a replay launches on the calling thread's current stream. The lock orders the
host calls only, so threads must share one stream per device (the default stream does): replays
queued from two threads on different streams could overlap on the GPU. Lock order: this lock, then
``ember.locks.COMPILE_LOCK`` (a compiled function may compile lazily), never the reverse.
"""
from __future__ import annotations

import logging
import threading

import torch

from ember.cudagraphs.pool import StorageWeakRef, pool_for
from ember.cudagraphs.recording import STATIC_PARAM, STATIC_POOL, STATIC_STABLE, capture

log = logging.getLogger("ember.cudagraphs")

MAX_RECORDINGS = 8
# Replacing a recording of the same shapes (held outputs, moved static inputs): off until it is fixed
# and tested on a GPU (see Runner._rerecord); the CPU tests exercise the logic with a fake CUDA API.
REPLACE_RECORDINGS = False
STATS = {"warmups": 0, "recordings": 0, "replays": 0, "fallbacks": 0, "disabled": [], "skipped": []}
_LOCK = threading.RLock()  # one runner call at a time, process-wide (see the docstring); re-entrant:
# a compiled function run by one runner may call another runner's graph


class Runner:
    """Calls ``fn`` (positional, or boxed like ``fn`` if it takes one list) through CUDA graphs."""

    def __init__(self, fn, *, name: str, api, mutated=frozenset(), max_recordings: int = MAX_RECORDINGS):
        self.fn, self.name, self.api = fn, name, api
        self._boxed_call = bool(getattr(fn, "_boxed_call", False))
        self.ember_native = getattr(fn, "ember_native", None)
        self.mutated = frozenset(mutated)
        self.max_recordings = max_recordings
        self.pool = None
        self.recordings: dict = {}
        self.current = None
        self.warm: dict = {}       # signature -> (address, weak storage ref) of each warm-up input
        self.demoted: set = set()  # inputs seen to move: always copied
        self.recorded = 0
        self.disabled: str | None = None
        self.moved_streak = 0

    def call_fn(self, args):
        return self.fn(list(args)) if self._boxed_call else self.fn(*args)

    def __call__(self, *args):
        if self._boxed_call:
            box = args[0]
            args = list(box)
            box.clear()  # the caller's list must not keep the inputs alive (boxed convention)
        if self.disabled is not None:
            return self.call_fn(args)
        if self.api.capturing(None):
            # inside someone else's capture (a user's ``torch.cuda.graph`` around the compiled
            # function): our kernels become part of their graph. Recording one of our own there
            # fails ("operation not permitted when stream is capturing") and a failure inside their
            # capture invalidates it; so run the function as is, and keep replaying outside it
            return self.call_fn(args)
        with _LOCK:
            return self._call(args)

    def _call(self, args):
        if self.disabled is not None:  # (disabled by another thread while this one waited)
            return self.call_fn(args)
        rec = self.current
        if rec is not None and rec.accepts(args):
            moved = rec.moved_static(args)
            return self._moved(rec, args, moved) if moved else self._replay(rec, args)
        return self._slow(args)

    # -- the decisions ---------------------------------------------------------------------------
    def _replay(self, rec, args):
        held = rec.held()
        if held:
            return self._hazard(rec, args, held)
        rec.hazard_streak = 0
        self.moved_streak = 0
        STATS["replays"] += 1
        return rec.replay(args)

    def _hazard(self, rec, args, held):
        for e in held:
            owner = e.owner
            if owner is not None:
                owner.force_copy(e.group)
        rec.hazard_streak += 1
        if rec.hazard_streak >= 2:
            # still held a call later: the caller keeps them on purpose; capture again around them
            return self._rerecord(rec, args, f"{len(held)} graph output(s) still held across calls")
        log.debug("ember cudagraphs: %s: a graph output is still held; running without the graph once", self.name)
        STATS["fallbacks"] += 1
        return self.call_fn(args)

    def _moved(self, rec, args, moved):
        rerecord = False
        for i in moved:
            kind = rec.static_kind[i]
            if kind == STATIC_POOL and self.pool.owner_of(args[i]) is None:
                continue  # upstream ran without its graph this once (see below)
            if kind == STATIC_STABLE:
                self.demoted.add(i)
            rerecord = True
        if rerecord:
            return self._rerecord(rec, args, f"static input(s) {sorted(moved)} moved")
        # An upstream graph's output came from a normal run (it had a hazard): run normally too.
        # Three times in a row means upstream stopped replaying: copy those inputs from now on.
        self.moved_streak += 1
        if self.moved_streak >= 3:
            self.demoted.update(moved)
            return self._rerecord(rec, args, f"static input(s) {sorted(moved)} keep coming from normal runs")
        STATS["fallbacks"] += 1
        return self.call_fn(args)

    def _slow(self, args):
        key = self._key(args)
        if key is None:
            return self.call_fn(args)
        rec = self.recordings.get(key)
        if rec is not None:
            self.current = rec
            if not rec.accepts(args):  # only a dynamic input aliased by an output with other strides
                STATS["fallbacks"] += 1
                return self.call_fn(args)
            moved = rec.moved_static(args)
            return self._moved(rec, args, moved) if moved else self._replay(rec, args)
        if key not in self.warm:
            # never capture on the first call: lazy initialization (kernel compilation, library
            # handles, allocator warm-up) must happen outside a capture
            self.warm[key] = [_identity(a) if isinstance(a, torch.Tensor) else None for a in args]
            STATS["warmups"] += 1
            return self.call_fn(args)
        return self._record(key, args)

    def _rerecord(self, rec, args, why: str):
        # Capturing again into the pool while the old graph's outputs are still alive tripped an
        # allocator assert on the H100 (torch 2.11), and a failed capture leaves the CUDA generator in
        # capture state for the whole process. Until that path is fixed and tested on hardware, a
        # function that would need a second recording of the same shapes runs without graphs.
        if not REPLACE_RECORDINGS:
            self._disable(f"{why}; recording again is disabled (see runner.REPLACE_RECORDINGS)")
            return self.call_fn(args)
        log.info("ember cudagraphs: %s: %s; recording again", self.name, why)
        return self._record(rec.key, args, replacing=rec)

    def _key(self, args):
        key = []
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                if not self.api.is_graph_tensor(a):
                    self._disable(f"input {i} is a {a.device.type} tensor")
                    return None
                key.append((tuple(a.shape), a.stride(), a.dtype, a.device))
            else:
                try:
                    hash(a)
                except TypeError:
                    self._disable(f"input {i} ({type(a).__name__}) is not hashable")
                    return None
                key.append((type(a), a))
        return tuple(key)

    # -- recording ---------------------------------------------------------------------------------
    def _static_inputs(self, key, args) -> dict:
        warm = self.warm.get(key) or [None] * len(args)
        owners = self.pool.owner_map()
        kinds = {}
        for i, a in enumerate(args):
            if not isinstance(a, torch.Tensor):
                continue
            if isinstance(a, torch.nn.Parameter):
                kinds[i] = STATIC_PARAM
            elif i in self.demoted:
                continue
            elif a.untyped_storage().data_ptr() in owners:
                kinds[i] = STATIC_POOL
            elif warm[i] is not None and _same_storage(warm[i], a):
                kinds[i] = STATIC_STABLE
        return kinds

    def _record(self, key, args, replacing=None):
        if self.pool is None:
            device = next(a.device for a in args if isinstance(a, torch.Tensor))
            self.pool = pool_for(device, self.api)
        if replacing is not None:
            replacing.release()
            self.recordings.pop(key, None)
            self.current = None
        if self.recorded >= self.max_recordings:
            self._disable(f"{self.recorded} recordings made (limit {self.max_recordings}: new shapes, or inputs "
                          "that keep moving or being held)")
            return self.call_fn(args)
        kinds = self._static_inputs(key, args)
        bad = sorted(i for i in self.mutated if i not in kinds)
        if bad:
            self._disable(f"the graph writes to input(s) {bad} in place, and they do not stay at one address; "
                          "a graph would write to its own copy")
            return self.call_fn(args)
        self.recorded += 1
        try:
            rec = capture(self, args, kinds)
        except Exception as exc:  # noqa: BLE001 - any capture failure: the function itself still works
            self._disable(f"capture failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            return self.call_fn(args)
        rec.key = key
        if replacing is not None and len(replacing.mode) == len(rec.mode):
            rec.mode = list(replacing.mode)  # outputs the caller kept before are copied from the start
        self.recordings[key] = self.current = rec
        STATS["recordings"] += 1
        log.debug("ember cudagraphs: %s: recorded graph #%d (%d static, %d copied inputs)", self.name,
                  self.recorded, len(kinds), len(rec.placeholders))
        return rec.build(args)

    def _disable(self, reason: str) -> None:
        self.disabled = reason
        for rec in self.recordings.values():
            rec.release()
        self.recordings.clear()
        self.current = None
        STATS["disabled"].append(f"{self.name}: {reason}")
        log.warning("ember cudagraphs: %s runs without CUDA graphs from now on: %s", self.name, reason)

    def __repr__(self) -> str:
        state = f"disabled: {self.disabled}" if self.disabled else f"{len(self.recordings)} graph(s)"
        return f"<ember cudagraphs runner {self.name} ({state})>"


def _identity(t: torch.Tensor):
    """The address and a weak reference to the storage of a warm-up input. The weak reference keeps
    the storage's bookkeeping (not its memory) alive, so a later storage never shares its identity."""
    return t.data_ptr(), StorageWeakRef(t.untyped_storage())


def _same_storage(warm, t: torch.Tensor) -> bool:
    """Is ``t`` at the warm-up input's address *in the warm-up input's storage* (not a new tensor
    the allocator placed in the same freed memory)?"""
    ptr, ref = warm
    return t.data_ptr() == ptr and not ref.expired() and ref.cdata == t.untyped_storage()._cdata
