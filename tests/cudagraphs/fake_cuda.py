"""A stand-in for torch.cuda's graph API on CPU tensors, so the runner's logic runs in CI.

Capturing records every ATen op the function runs (a TorchDispatchMode), with the very tensor
objects it used and made; a replay runs the ops again and writes each result into the tensor the op
made at capture. So, like a real CUDA graph, a replay reads its inputs from the captured tensors'
memory, writes its outputs to the captured outputs' memory, and runs no Python of the function.
After a capture the outputs are poisoned with NaN (a real capture runs nothing), so a runner that
forgets to replay after capturing returns garbage here too. Host reads (``.item()``) inside a
capture raise, as they do on a GPU.
"""
from __future__ import annotations

import contextlib

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
_HOST_READS = {aten._local_scalar_dense.default}


class FakeGraph:
    def __init__(self, api):
        self.ops = []
        self.api = api

    def replay(self):
        self.api.replays += 1
        for func, args, kwargs, outs, fresh in self.ops:
            res = pytree.tree_leaves(func(*args, **kwargs))
            for o, r, f in zip(outs, res, fresh):
                if f:
                    o.copy_(r)

    def poison(self):
        for _, _, _, outs, fresh in self.ops:
            for o, f in zip(outs, fresh):
                if f and o.is_floating_point():
                    o.fill_(float("nan"))


class _Recorder(TorchDispatchMode):
    """Records ops; writes to tensors that existed before the capture are undone at its end
    (a real capture runs nothing, so it changes nothing)."""

    def __init__(self, graph):
        super().__init__()
        self.graph = graph
        self.made = set()      # storages created during the capture
        self.saved = {}        # storage ptr -> (tensor, its contents before the capture)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _HOST_READS:
            raise RuntimeError("operation not permitted when stream is capturing (fake CUDA graph)")
        for k, a in enumerate(func._schema.arguments):
            if a.alias_info is not None and a.alias_info.is_write:
                t = args[k] if k < len(args) else kwargs.get(a.name)
                if isinstance(t, torch.Tensor):
                    ptr = t.untyped_storage().data_ptr()
                    if ptr not in self.made and ptr not in self.saved:
                        whole = torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())
                        self.saved[ptr] = (whole, whole.clone())
        res = func(*args, **kwargs)
        ins = {t.untyped_storage().data_ptr() for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        outs = pytree.tree_leaves(res)
        fresh = [isinstance(o, torch.Tensor) and o.untyped_storage().nbytes() > 0
                 and o.untyped_storage().data_ptr() not in ins for o in outs]
        for o, f in zip(outs, fresh):
            if f:
                self.made.add(o.untyped_storage().data_ptr())
        # like a real graph, keep only the addresses of tensors that existed before the capture
        rec_args, rec_kwargs = pytree.tree_map_only(torch.Tensor, self._address, (args, kwargs))
        outs = [o if f else None for o, f in zip(outs, fresh)]  # views of inputs are not written at replay
        self.graph.ops.append((func, rec_args, rec_kwargs, outs, fresh))
        return res

    def _address(self, t):
        st = t.untyped_storage()
        if st.data_ptr() in self.made or st.nbytes() == 0:
            return t
        unowned = torch._C._construct_storage_from_data_pointer(st.data_ptr(), t.device, st.nbytes())
        return torch.empty(0, dtype=t.dtype, device=t.device).set_(unowned, t.storage_offset(), t.shape, t.stride())

    def undo(self):
        for whole, before in self.saved.values():
            whole.copy_(before)


class FakeEvent:
    def __init__(self, api):
        self.api, self.t, self.synced = api, None, False

    def query(self):
        return self.synced or self.api.events_done

    def synchronize(self):
        self.synced = True

    def elapsed_time(self, end):  # milliseconds, as torch.cuda.Event's
        return (end.t - self.t) / 1e3


class FakeCuda:
    """The ``TorchCuda`` interface of ember.cudagraphs.pool, on CPU tensors."""
    name = "fake"

    def __init__(self):
        # counters only: holding the graphs would keep their tensors alive, which a real graph does not
        self.captures = 0
        self.replays = 0

    def is_graph_tensor(self, t):
        return t.device.type == "cpu"

    def new_pool(self, device):
        return ("fake pool", str(device))

    def new_stream(self, device):
        return None

    def new_graph(self):
        self.captures += 1
        return FakeGraph(self)

    @contextlib.contextmanager
    def on_stream(self, stream):
        yield

    @contextlib.contextmanager
    def rng_restored(self, stream):
        state = torch.get_rng_state()
        try:
            yield
        finally:
            torch.set_rng_state(state)

    # timing (ember.cudagraphs.measure): a device clock in microseconds that the test's compiled
    # function advances; events read it when recorded
    device_clock = 0.0
    events_done = True     # what an event's query() answers
    total = 80 << 30       # device memory
    capturing_now = False

    def new_event(self):
        return FakeEvent(self)

    def record(self, event, device):
        event.t = self.device_clock

    def capturing(self, device):
        return self.capturing_now

    def synchronize(self, device):
        self.syncs = getattr(self, "syncs", 0) + 1

    def total_memory(self, device):
        return self.total

    def device_name(self, device):  # (what a stored measured decision is keyed by)
        return self.name_of_device

    name_of_device = "fake device"

    @contextlib.contextmanager
    def capture(self, graph, pool, stream):
        rec = _Recorder(graph)
        with rec:
            yield
        rec.undo()
        graph.poison()
