"""The memory pool that the CUDA graphs of one device share, and the record of what lives in it.

Every graph is captured into one private pool (``torch.cuda.graph_pool_handle``), so the scratch
memory of one graph is reused by the next capture instead of each graph keeping its own. That sharing
has one hazard, and this module tracks it. Captures happen in a sequence. When graph G is captured,
the outputs of earlier graphs are alive (their runners hold them), so G never places anything on
them; but G's outputs may land on memory that an earlier graph F used as scratch and freed. Replaying
F then overwrites G's outputs. Hence the rule the runner checks before each replay of a graph with
capture number ``s``: **no output storage of a capture numbered >= s may be held by anyone but its
runner** (a user's tensor, a view, autograd's saved tensors). Outputs abandoned by a re-recording stay
in the record under their old number until their last holder lets go.

"Held" is measured on the storage: ``torch._C._storage_Use_Count`` counts the tensors (views
included) that share it, through a weak reference (``StorageWeakRef``) that never keeps it alive.
Each entry knows how many of those references are the runner's own (``baseline``).

``TorchCuda`` is the only place that touches ``torch.cuda`` graph APIs; tests pass a fake one.
"""
from __future__ import annotations

import contextlib
import dataclasses
import weakref

import torch

try:  # the weak storage reference that torch's own multiprocessing code uses
    from torch.multiprocessing.reductions import StorageWeakRef
except ImportError:  # pragma: no cover - every supported torch has it
    StorageWeakRef = None

_use_count = getattr(torch._C, "_storage_Use_Count", None)


def liveness_supported() -> bool:
    """Can held outputs be detected? Without it, replaying could overwrite tensors a caller holds."""
    return StorageWeakRef is not None and _use_count is not None


class TorchCuda:
    """The torch.cuda calls the graph machinery makes (a fake one replaces it in CPU tests)."""

    name = "cuda"

    def is_graph_tensor(self, t: torch.Tensor) -> bool:
        return t.device.type == "cuda"

    def new_pool(self, device):
        with torch.cuda.device(device):
            return torch.cuda.graph_pool_handle()

    def new_stream(self, device):
        return torch.cuda.Stream(device=device)

    def new_graph(self):
        return torch.cuda.CUDAGraph()

    @contextlib.contextmanager
    def on_stream(self, stream):
        """Run on ``stream``, ordered after the work already queued on the current one."""
        cur = torch.cuda.current_stream(stream.device)
        stream.wait_stream(cur)
        with torch.cuda.stream(stream):
            yield
        cur.wait_stream(stream)

    @contextlib.contextmanager
    def rng_restored(self, stream):
        """The default generator of ``stream``'s device as it was before the block: the warm-up run
        before a capture draws random numbers that no caller sees; without this, the recording call's
        dropout masks and the generator state every later draw starts from were one draw ahead of
        eager's (the capture itself draws nothing: a replay advances the generator by what it uses)."""
        state = torch.cuda.get_rng_state(stream.device)
        try:
            yield
        finally:
            torch.cuda.set_rng_state(state, stream.device)

    # timing a compiled graph's first calls (``measure``)
    def new_event(self):
        return torch.cuda.Event(enable_timing=True)

    def record(self, event, device) -> None:
        event.record(torch.cuda.current_stream(device))

    def capturing(self, device) -> bool:
        return torch.cuda.is_current_stream_capturing()

    def synchronize(self, device) -> None:
        torch.cuda.current_stream(device).synchronize()

    def total_memory(self, device) -> int:
        return torch.cuda.get_device_properties(device).total_memory

    def device_name(self, device) -> str:
        """What a stored measured decision is keyed by (``stored``): the device's kind."""
        p = torch.cuda.get_device_properties(device)
        return f"{p.name} sm{p.major}{p.minor} {p.multi_processor_count} SMs"

    def capture(self, graph, pool, stream):
        # thread_local: another thread's CUDA calls do not invalidate this capture (torch's choice too)
        return torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local")


@dataclasses.dataclass(eq=False)
class Entry:
    """One output storage of one capture."""
    seq: int                # capture number of the graph that allocated it
    ref: object             # StorageWeakRef
    baseline: int           # references its owner holds (0 once abandoned)
    owner_ref: object = None  # weakref to the Recording that returns it; None once abandoned
    group: int = -1         # the owner's index for this storage

    @property
    def owner(self):
        return self.owner_ref() if self.owner_ref is not None else None

    def held(self) -> bool:
        return _use_count(self.ref.cdata) > self.baseline

    def dead(self) -> bool:
        return self.owner is None and self.ref.expired()


def _orphan(entries):
    """Weakref callback: the recording is gone (its runner was freed), so none of the references
    to these storages are its own any more."""
    def callback(_ref):
        for e in entries:
            e.owner_ref, e.baseline = None, 0
    return callback


class GraphPool:
    """One private memory pool, its capture stream, its capture counter and its output record."""

    def __init__(self, device, api):
        self.device, self.api = device, api
        self.handle = api.new_pool(device)
        self.stream = api.new_stream(device)
        self.next_seq = 0
        self.entries: list[Entry] = []
        self.version = 0  # bumped when entries change, so runners can cache their watch lists

    def new_seq(self) -> int:
        self.next_seq += 1
        return self.next_seq

    def register(self, seq: int, storages: list, owner) -> list[Entry]:
        """Watch the output storages of capture ``seq``; baselines are set by the caller once the
        owner holds exactly its own references."""
        added = [Entry(seq, StorageWeakRef(s), 0, None, g) for g, s in enumerate(storages)]
        ref = weakref.ref(owner, _orphan(added))
        for e in added:
            e.owner_ref = ref
        self.prune()
        self.entries += added
        self.version += 1
        return added

    def abandon(self, entries: list[Entry]) -> None:
        """The owner lets these storages go (re-recording): they stay watched while anyone holds them."""
        for e in entries:
            e.owner_ref, e.baseline = None, 0
        self.prune()

    def prune(self) -> None:
        live = [e for e in self.entries if not e.dead()]
        if len(live) != len(self.entries):
            self.entries = live
            self.version += 1

    def watch_list(self, seq: int) -> list[Entry]:
        """Entries a replay of capture ``seq`` could overwrite (see module docstring)."""
        return [e for e in self.entries if e.seq >= seq]

    def owner_map(self) -> dict:
        """Storage address -> entry, for the storages a live recording still returns."""
        out = {}
        for e in self.entries:
            owner = e.owner
            if owner is not None:
                out[owner.storage_ptr(e.group)] = e
        return out

    def owner_of(self, t: torch.Tensor):
        """The live entry whose storage ``t`` lives in, or None."""
        return self.owner_map().get(t.untyped_storage().data_ptr())


_POOLS: dict = {}


def pool_for(device, api) -> GraphPool:
    """The process-wide pool of ``device`` (as torch keeps one graph tree per device)."""
    key = (api.name, str(device))
    pool = _POOLS.get(key)
    if pool is None:
        pool = _POOLS[key] = GraphPool(device, api)
    return pool


def reset_pools() -> None:
    _POOLS.clear()
