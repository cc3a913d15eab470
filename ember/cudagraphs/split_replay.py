"""A split inference graph (regional compilation's parts) replayed as one CUDA graph.

Why: regional compilation (``ember/backends/regional.py``) compiles each repeated block once and
calls the shared compiled parts in order from the split GraphModule. No part may replay a CUDA graph
of its own: it runs for every layer with that layer's weights, which a replay would copy into the
captured addresses at every call. So a regional model launched each kernel from Python, where the
same model compiled whole replayed one graph: GPT-2 inference at 8 x 512 on an H100 took 3.06 ms
per step regional against 2.44 ms whole, and 5.83 against 4.23 ms at 24 layers, with 2.98 and 5.27
ms of host time per call (``regional_compile-gpt2-h100-s43.json``). The split graph itself is called
with the model's inputs (parameters where they lie, the batch), as the whole graph is, so it can be
captured whole: every part's kernels for every layer, each reading that layer's weights in place.

How (``wrap``, in place of the split GraphModule the regional pass returns):

* only inference graphs of ember's own backend in default mode (``mode="reduce-overhead"`` parts
  are never shared), on CUDA tensors, with ``config.auto_cudagraphs`` on, outside torch.distributed;
* call 1 runs the split graph as is: it compiles every part (or takes it from the shared table);
* then each part's compiled callable tells what capturing it would face, read from its graph when
  it was compiled (``auto.part_facts``: the capture check of ``analysis``, whether it writes an
  input, its pool's size). Any part that cannot be captured, writes an input, or was not compiled by
  ember's code generator keeps the split graph running as it is, for good (logged);
* otherwise the decision is default mode's measured one for inference graphs (``measure.Measured``):
  calls 2-4 are timed, host against device, and from then on the split graph replays through a
  ``runner.Runner`` (warm-up, recording, its checks before each replay) when its host time is at
  least ``Rule.measured_host_fraction`` of its device time, else runs as it is. The pool bound is
  the sum of the parts' pools, one per call (an upper bound of the split graph's peak).

Each decision is logged on the ``ember.cudagraphs`` logger and kept in ``auto.DECISIONS`` (name
``split#...``).
"""
from __future__ import annotations

import itertools
import logging
import threading

import torch
import torch.fx as fx

log = logging.getLogger("ember.cudagraphs")
_ids = itertools.count()


def _api():
    from ember.cudagraphs.pool import TorchCuda
    return TorchCuda()


API = _api  # (the tests put a fake CUDA API here)


def eligible(example_inputs, key: tuple | None, api) -> str | None:
    """Why a split graph compiled under ``key`` for ``example_inputs`` is not considered, or None."""
    from ember.config import config
    if not config.auto_cudagraphs:
        return "ember.config.auto_cudagraphs is off"
    if key is None or key[0] != "ember" or key[1] not in (None, "default"):
        return f"compiled by {key}: only ember's default mode replays automatically"
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs):
        return "a training graph: its parts are autograd nodes"
    dist = getattr(torch, "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        return "distributed: parameters may be resharded between calls"
    tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
    if not tensors or not all(api.is_graph_tensor(t) for t in tensors):
        return "not every input is a CUDA tensor"
    return None


def wrap(split: fx.GraphModule, example_inputs, key: tuple | None, api=None):
    """``split`` itself, or a ``SplitReplay`` of it (module docstring)."""
    api = api or API()
    why = eligible(example_inputs, key, api)
    if why is not None:
        log.debug("ember auto cudagraphs: a split graph runs part by part: %s", why)
        return split
    device = next(t.device for t in example_inputs if isinstance(t, torch.Tensor))
    return SplitReplay(split, api, device)


class SplitReplay:
    """Calls the split graph; after its first call, decides whether it replays whole (module docstring)."""

    def __init__(self, split: fx.GraphModule, api, device):
        self.split, self.api, self.device = split, api, device
        self.name = f"split#{next(_ids)}"
        self.decision: tuple | None = None  # (replay?, why) once known
        self._lock = threading.Lock()
        self._target = self._first

    def __call__(self, *args):
        return self._target(*args)

    def _first(self, *args):
        out = self.split(*args)  # compiles the parts
        if self._lock.acquire(blocking=False):  # (another thread decides: nothing to do here)
            try:
                if self._target == self._first:
                    self._target = self._after_first_call(args)
            finally:
                self._lock.release()
        return out

    def _retarget(self, target) -> None:
        self._target = target

    def _after_first_call(self, args):
        from ember.cudagraphs import auto
        problem, pool = self._facts()
        limit = auto.pool_limit(self.api, self.device)
        if problem is None and pool > limit:
            problem = f"its parts' pools would hold {pool / 2**20:.0f} MiB for good > {limit / 2**20:.0f} MiB allowed"
        if problem is not None:
            self.decision = (False, problem)
            auto.DECISIONS.append((self.name, False, problem))
            log.info("ember auto cudagraphs: %s runs part by part: %s", self.name, problem)
            return self.split
        from ember.cudagraphs.measure import Measured
        from ember.cudagraphs.runner import Runner
        why = f"every part can be captured; deciding by timing calls 2-{1 + auto.RULE.measure_calls}"
        auto.DECISIONS.append((self.name, False, why))
        log.info("ember auto cudagraphs: %s (a split graph of %d parts): %s", self.name, len(self._parts()), why)
        runner = Runner(self.split, name=self.name, api=self.api)
        measured = Measured(self.split, runner, name=self.name, api=self.api, device=self.device,
                            est=dict(pool_bytes=pool, pool_limit=limit, bytes=pool))
        measured.calls = 1  # (its untimed first call was this one)
        measured.on_decided(self._retarget)
        return measured

    def _parts(self) -> list:
        """The compiled callable of each part call, in graph order (None: not compiled yet)."""
        from ember.backends.regional import RegionalPart
        out = []
        for n in self.split.graph.nodes:
            if n.op != "call_module":
                continue
            fn = self.split.__dict__.get(n.target)  # (a compiled part took its attribute's place)
            if fn is None:
                sub = self.split._modules.get(n.target)
                fn = sub.fn if isinstance(sub, RegionalPart) else None
            out.append((n.target, fn))
        return out

    def _facts(self) -> tuple:
        """(why the split graph cannot replay whole or None, its pool bound in bytes)."""
        from ember.backends.regional import capture_facts_of
        pool = 0
        for name, fn in self._parts():
            facts = capture_facts_of(fn) if fn is not None else None
            if facts is None:
                return f"part {name} was not compiled by ember's code generator", 0
            if facts["problem"]:
                return f"part {name} cannot be captured: {facts['problem']}", 0
            writes = _writes_an_input(fn)
            if writes is None:
                return f"part {name} is not a graph of the autograd layer", 0
            if facts["mutates"] or writes:
                return f"part {name} writes one of its inputs", 0
            pool += facts["pool"]
        return None, pool

    def __repr__(self) -> str:
        return f"<ember split graph replay {self.name} ({self.decision or 'deciding'})>"


def _writes_an_input(fn) -> bool | None:
    """Whether the autograd layer's compiled graph ``fn`` writes one of its inputs (None: ``fn`` is not
    one). The compiled graph is functional: a mutation of an input is written back by the layer's
    epilogue after the compiled call (``ember/aot/runtime.py``), so the code generator's graph shows
    none; the layer's metadata of each traced variant does. A variant that runs eagerly (its trace
    failed) counts as writing: nothing about it is known."""
    variants = getattr(fn, "variants", None)
    if not isinstance(variants, dict) or not variants:
        return None
    for v in list(variants.values()):
        meta = getattr(v, "meta", None)
        if meta is None or getattr(v, "reason", None) is not None or getattr(meta, "mutated", None) is None:
            return True
        if meta.mutated:
            return True
    return False
