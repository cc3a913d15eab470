"""The measured decision: an inference graph that the estimate calls device-bound is timed on its first
calls, and replays as a CUDA graph from then on if the host turns out to be what the GPU waits for.

Why measure: the estimate (``auto.decide``) charges every launch a fixed host cost, and that is wrong
by several times for graphs of library calls on a slow host. BERT-base inference (b16x256 bf16, one
graph of 147 kernels: 72 cuBLAS matmuls, 12 cuDNN attentions) was estimated at ~0.7 ms of host time
for ~2.9 ms of device time; on the H100 host it took 3.98 ms of host time per call for 1.72 ms on the
device (``benchmarks/kernel_profile.py``), so the GPU idled more than half of each call. Hosts differ
by 1.5x for the same code, so no constant fits every machine; a measurement does.

How (``Measured``, returned by ``auto.wrap_auto`` in place of the compiled function):

- call 1 runs as compiled, untimed: it may compile or load lazily (kernels, cuBLAS/cuDNN plans);
- calls 2 .. 1 + ``Rule.measure_calls`` are timed: host time is ``perf_counter`` around the call
  (no synchronization), device time a pair of timing events recorded on the device's current stream
  around it. Before the first timed call the stream is synchronized once, so that call starts on an
  idle GPU: its host time is issue time, not time spent waiting for a full launch queue (a
  device-bound graph's host blocks once the queue is full, and its host time would read as its
  device time). Before that, ember's own background work is waited for (``_quiesce``: the prewarm
  threads, kernel batches on the build workers), which would otherwise take the GIL or a core from
  the timed calls. Each figure's least value over the timed calls is kept: a timer only adds time;
- the events are read with ``query()`` at each later call (no synchronization: a host-bound graph's
  events are done by the next call, since its GPU waits). A call finding them not done yet runs as
  compiled; after ``Rule.measure_wait_calls`` such calls the last event is synchronized once;
- then ``auto.decide_measured`` decides. Replay: the runner made at compile time (``cudagraphify``,
  as for a graph the estimate replays) takes over from that call on, with its own warm-up and
  recording and every guarantee of ``runner``: outputs a caller still holds are never overwritten,
  moved inputs are copied, anything odd runs the compiled function. No replay: the compiled function
  is called directly from then on.

The decision replaces the graph's entry in ``auto.DECISIONS`` (which said "deciding by timing") and is
logged on the ``ember.cudagraphs`` logger with the numbers.

The decision is stored with the graph's cache entry (``stored``: keyed by the native graph's cache
key, the device's name, the host's CPU model and the rule), and a process that loads the graph from
the cache on that kind of device and host takes it ("reused measured decision" in the log) instead
of measuring: what runs beside a process's first calls differs between a compiling process and a
warm one (a full garbage collection of the compile's heap, a warm start's loading threads), and two
processes measuring the same graph near the threshold took different sides of it (ResNet-50
inference, H100, session 38). Host time is a property of the host (BERT's step took 2.48 ms on one
H100 host and 3.7 ms on another with the same code): a cache moved to another CPU model measures
again. A graph with no cache key (the cache off) is measured in every process.

Once decided, the caller holding this object (``InferenceVariant``, through ``on_decided``) calls the
runner or the compiled function directly: the steady call path is the one a process reusing a
stored decision has.

Threads: one thread measures at a time; a call arriving meanwhile runs as compiled, untimed.
Calls inside another CUDA-graph capture are not timed (no synchronization or event query there).
"""
from __future__ import annotations

import logging
import threading
import time

from ember.cudagraphs import stored

log = logging.getLogger("ember.cudagraphs")
_now = time.perf_counter  # (the tests' clock replaces it)


class Measured:
    """The compiled function ``fn`` while its first calls are timed, then ``runner`` (a replay) or
    ``fn`` itself; called like ``fn`` (boxed if it is)."""

    def __init__(self, fn, runner, *, name: str, api, device, est: dict, rule=None):
        from ember.cudagraphs import auto
        self.fn, self.runner, self.name, self.api, self.device, self.est = fn, runner, name, api, device, est
        self.rule = rule or auto.RULE
        self._boxed_call = bool(getattr(fn, "_boxed_call", False))
        self.ember_native = getattr(fn, "ember_native", None)
        self._target = self._measure
        self._lock = threading.Lock()
        self.calls = 0
        self.timed: list = []    # (host us, start event, end event)
        self.waited = 0
        self.decision = None     # (replay?, why) once decided
        self._holders: list = []  # retarget(target) of each caller holding this object (``on_decided``)

    def __call__(self, *args):
        return self._target(*args)

    def on_decided(self, retarget) -> None:
        """``retarget(target)`` is called once decided, with what to call from then on (the runner or
        the compiled function, called as this object is): a caller holding this object swaps it out,
        so its steady calls take the path a process that reused a stored decision takes
        (``stored``), with no call through this object."""
        if self.decision is not None:
            retarget(self._target)
        else:
            self._holders.append(retarget)

    def _measure(self, *args):
        if not self._lock.acquire(blocking=False):  # another thread measures: this call is not timed
            return self.fn(*args)
        try:
            target = self._target
            if self.decision is None:
                self.calls += 1
                if self.calls == 1 or self.api.capturing(self.device):
                    target = self.fn
                elif len(self.timed) < self.rule.measure_calls:
                    return self._timed(args)
                elif self._ready():
                    target = self._decide()
                else:
                    target = self.fn
        finally:
            self._lock.release()
        return target(*args)

    def _timed(self, args):
        api, device = self.api, self.device
        if not self.timed:
            _quiesce()  # nothing of ember's own runs beside the timed calls (module docstring)
            api.synchronize(device)  # the first timed call starts on an idle GPU (module docstring)
        start, end = api.new_event(), api.new_event()
        api.record(start, device)
        t0 = _now()
        out = self.fn(*args)
        host_us = (_now() - t0) * 1e6
        api.record(end, device)
        self.timed.append((host_us, start, end))
        return out

    def _ready(self) -> bool:
        end = self.timed[-1][2]
        if end.query():
            return True
        self.waited += 1
        if self.waited < self.rule.measure_wait_calls:
            return False
        end.synchronize()  # (a GPU this far behind its host: device-bound; read it now)
        return True

    def _decide(self):
        from ember.cudagraphs import auto
        samples = [(host, start.elapsed_time(end) * 1e3) for host, start, end in self.timed]
        self.timed = []
        replay, why = auto.decide_measured(self.est, None, samples, self.rule)
        self.decision = (replay, why)
        self._target = self.runner if replay else self.fn
        self.runner = self.runner if replay else None
        record(self.name, replay, why, samples, self.ember_native)
        stored.store(self.fn, self.api, self.device, self.rule, replay, why, samples)  # (for the next process)
        for retarget in self._holders:
            retarget(self._target)
        self._holders = []
        log.info("ember auto cudagraphs: %s %s: %s", self.name,
                 "replays as a CUDA graph from now on" if replay else "runs as compiled", why)
        return self._target

    def __repr__(self) -> str:
        state = f"decided: {self.decision}" if self.decision else f"measuring ({len(self.timed)} call(s) timed)"
        return f"<ember cudagraphs measured {self.name} ({state})>"


def _quiesce() -> None:
    """Wait for what ember itself still runs in the background: the prewarm threads (Triton's cache
    key, its driver, cuBLAS: a warm start whose kernels all come from the cache never waits for them
    otherwise, so they may still run at its second call) and the kernel batches handed to the build
    workers. Each would take the GIL or a core from the timed calls, which would read as host time."""
    from ember.native import build_pool, runtime
    for t in (runtime._PREWARM, runtime._DRIVER_PREWARM, runtime._CUDA_PREWARM):
        if hasattr(t, "join"):
            t.join()
    build_pool.wait()


def record(name: str, replay: bool, why: str, samples: list, info) -> None:
    """The measured decision replaces the graph's entry of ``auto.DECISIONS`` (appended if gone)."""
    from ember.cudagraphs import auto
    entry = (name, replay, why)
    for k in range(len(auto.DECISIONS) - 1, -1, -1):
        if auto.DECISIONS[k][0] == name:
            auto.DECISIONS[k] = entry
            break
    else:
        auto.DECISIONS.append(entry)
    if isinstance(info, dict) and isinstance(info.get("auto_cudagraphs"), dict):
        info["auto_cudagraphs"].update(replay=replay, reason=why, measured_us=[list(s) for s in samples])
