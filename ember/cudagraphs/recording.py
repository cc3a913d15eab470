"""One captured CUDA graph: how each input reaches it, how each output leaves it.

Inputs. A *static* input is read by the graph where it lies: its address is checked before each
replay (the runner's job), nothing is copied. A *dynamic* input is copied into a placeholder the
graph reads; the placeholder has the shape, dtype and strides it was captured with, and ``copy_``
converts whatever layout the caller passes into it. Inputs whose layout is not dense (expanded,
overlapping) are copied as their raw memory span instead, so they must keep their strides.

Outputs. Tensors the graph allocated live in the shared pool and are overwritten by the next replay.
Each storage is returned in one of two modes: ALIAS (a new tensor on the pool storage: free, and
safe as long as the caller lets go before the next replay) or COPY (a fresh copy of the storage).
The runner switches a storage to COPY when it finds a caller still holding it at a replay, and a
storage returns to ALIAS after ``REVERT_AFTER`` calls in a row whose copies nobody kept. Outputs that
alias an input are rebuilt on the caller's input; non-tensor outputs are returned as captured.
"""
from __future__ import annotations

import torch
import torch.utils._pytree as pytree

from ember.cudagraphs.pool import StorageWeakRef, _use_count

ALIAS, COPY = 0, 1
OUT, INPUT, CONST, EMPTY = 0, 1, 2, 3
REVERT_AFTER = 4
STATIC_PARAM, STATIC_POOL, STATIC_STABLE = "parameter", "pool output", "stable address"


def _dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense: ``copy_`` into a tensor of these strides writes every element once."""
    dims = sorted((st, s) for s, st in zip(t.shape, t.stride()) if s != 1)
    expect = 1
    for st, s in dims:
        if st != expect:
            return False
        expect *= s
    return True


def _span(t: torch.Tensor) -> int:
    return 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride())) if t.numel() else 0


class Placeholder:
    """The graph's copy of one dynamic input."""
    __slots__ = ("index", "shape", "dtype", "stride", "dense", "tensor", "base")

    def __init__(self, index: int, t: torch.Tensor):
        self.index, self.shape, self.dtype, self.stride = index, t.shape, t.dtype, t.stride()
        self.dense = _dense(t)
        if self.dense:
            self.tensor = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
            self.base = None
        else:  # keep the exact strides: copy the raw span of memory the view covers
            self.base = torch.empty(_span(t), dtype=t.dtype, device=t.device)
            self.tensor = self.base.as_strided(t.shape, t.stride(), 0)

    def accepts(self, t) -> bool:
        if not isinstance(t, torch.Tensor) or t.shape != self.shape or t.dtype != self.dtype:
            return False
        return self.dense or t.stride() == self.stride

    def fill(self, t: torch.Tensor) -> None:
        if self.base is None:
            self.tensor.copy_(t)
        else:
            self.base.copy_(t.as_strided((self.base.numel(),), (1,), t.storage_offset()))


class Recording:
    """A captured graph of one runner for one input signature; built by ``capture``."""

    def __init__(self, runner, seq: int, static_kind: dict, args: list):
        self.runner, self.pool, self.seq = runner, runner.pool, seq
        self.static_kind = static_kind
        self.static_idx = tuple(sorted(static_kind))
        self.static_ptrs = [args[i].data_ptr() for i in self.static_idx]
        # inputs static only because they stayed put: the same address could hold another view
        self.stable = [(i, args[i].shape, args[i].stride()) for i in self.static_idx
                       if static_kind[i] == STATIC_STABLE]
        self.placeholders: list[Placeholder] = []
        self.consts = [(i, a) for i, a in enumerate(args) if not isinstance(a, torch.Tensor)]
        self.graph = None
        self.plan: list = []
        self.spec = None
        self.outs: list = []        # pool outputs (slot -> tensor)
        self.group_of: list = []    # slot -> storage group
        self.group_flat: list = []  # group -> uint8 tensor over the whole storage
        self.mode: list = []        # group -> ALIAS | COPY
        self.entries: list = []     # group -> pool Entry
        self.copy_refs: list = []   # group -> weak ref of the last copy handed out
        self.clean: list = []       # group -> calls in a row whose copy nobody kept
        self.alias_dynamic: set = set()  # dynamic inputs some output is a view of (strides must match)
        self.hazard_streak = 0
        self._watch, self._watch_version = [], -1

    # -- matching a call -------------------------------------------------------------------------
    def moved_static(self, args) -> list[int]:
        """Static inputs whose address differs from the captured one ([] if none)."""
        ptrs = self.static_ptrs
        for k, i in enumerate(self.static_idx):
            if args[i].data_ptr() != ptrs[k]:
                return [i for k, i in enumerate(self.static_idx) if args[i].data_ptr() != ptrs[k]]
        return []

    def accepts(self, args) -> bool:
        """Same shapes/dtypes for the copied inputs and equal non-tensor arguments."""
        for p in self.placeholders:
            if not p.accepts(args[p.index]):
                return False
            if p.index in self.alias_dynamic and args[p.index].stride() != p.stride:
                return False
        for i, v in self.consts:
            if args[i] is not v and args[i] != v:
                return False
        for i, shape, stride in self.stable:
            if args[i].shape != shape or args[i].stride() != stride:
                return False
        return True

    def held(self) -> list:
        """Pool entries a replay would overwrite while someone still holds them."""
        pool = self.pool
        if self._watch_version != pool.version:
            self._watch, self._watch_version = pool.watch_list(self.seq), pool.version
        for e in self._watch:
            if _use_count(e.ref.cdata) > e.baseline:
                return [e for e in self._watch if e.held()]
        return []

    # -- running -----------------------------------------------------------------------------------
    def replay(self, args):
        for p in self.placeholders:
            p.fill(args[p.index])
        self.graph.replay()
        return self.build(args)

    def build(self, args):
        flat, copies = [], None
        for kind, a in self.plan:
            if kind == OUT:
                g = self.group_of[a]
                if self.mode[g] == ALIAS:
                    flat.append(self.outs[a].detach())
                else:
                    if copies is None:
                        copies = {}
                    flat.append(self._copy(a, g, copies))
            elif kind == INPUT:
                i, size, stride, delta, same = a
                x = args[i]
                flat.append(x if same else torch.as_strided(x, size, stride, x.storage_offset() + delta))
            elif kind == CONST:
                flat.append(a)
            else:  # EMPTY: a zero-size tensor has no storage to share
                flat.append(torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device))
        if copies is not None:
            self._note_copies(copies)
        spec = self.spec
        if spec is list:
            return flat
        return tuple(flat) if spec is tuple else pytree.tree_unflatten(flat, spec)

    def _copy(self, slot, g, copies):
        """A fresh copy of slot's storage (once per storage per call, so outputs sharing a storage
        still share the copy), viewed like the original."""
        new = copies.get(g)
        if new is None:
            new = copies[g] = self.group_flat[g].clone()
        t = self.outs[slot]
        return torch.empty((), dtype=t.dtype, device=t.device).set_(
            new.untyped_storage(), t.storage_offset(), t.shape, t.stride())

    def _note_copies(self, copies):
        """Copies nobody kept until the next call: after REVERT_AFTER such calls, alias again."""
        for g, new in copies.items():
            old = self.copy_refs[g]
            if old is not None:
                if old.expired():
                    self.clean[g] += 1
                    if self.clean[g] >= REVERT_AFTER:
                        self.mode[g], self.clean[g] = ALIAS, 0
                else:
                    self.clean[g] = 0
            self.copy_refs[g] = StorageWeakRef(new.untyped_storage()) if self.mode[g] == COPY else None

    def force_copy(self, g: int) -> None:
        self.mode[g], self.clean[g], self.copy_refs[g] = COPY, 0, None

    def storage_ptr(self, g: int) -> int:
        return self.group_flat[g].data_ptr()

    def release(self) -> None:
        """Drop the graph and hand the output storages over to whoever still holds them."""
        self.pool.abandon(self.entries)
        self.graph = None
        self.outs, self.group_flat, self.placeholders = [], [], []


def capture(runner, args: list, static_kind: dict) -> Recording:
    """Warm up on the placeholders, capture ``runner``'s function into a new graph, replay it once
    (capture runs nothing) and return the recording. ``static_kind``: input position -> why it is
    read in place (the others are copied). Raises if the capture fails."""
    api, pool = runner.api, runner.pool
    rec = Recording(runner, pool.new_seq(), static_kind, args)
    call_args = list(args)
    static = set(static_kind)
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor) and i not in static:
            p = Placeholder(i, a)
            p.fill(a)
            rec.placeholders.append(p)
            call_args[i] = p.tensor
    # one run on the capture stream first: any kernel specialization the placeholders need is
    # compiled, and library workspaces are allocated, outside the capture. Inputs the graph writes
    # to get a scratch copy for it, so the write is not applied twice, and the random numbers it
    # draws are given back (api.rng_restored), so the stream of draws is eager's.
    warm_args = [a.clone() if i in runner.mutated and i in static else a for i, a in enumerate(call_args)]
    with api.on_stream(pool.stream), api.rng_restored(pool.stream):
        runner.call_fn(warm_args)
    del warm_args
    graph = api.new_graph()
    with api.capture(graph, pool.handle, pool.stream):
        outs = runner.call_fn(list(call_args))
    rec.graph = graph
    _plan_outputs(rec, runner, outs, call_args, static)
    # the storage references that exist now are the recording's own (its outputs, the whole-storage
    # views, what a fake graph keeps in tests): a count above this later is a caller holding one
    for e in rec.entries:
        e.baseline = _use_count(e.ref.cdata)
    graph.replay()  # capturing recorded the kernels without running them
    return rec


def _plan_outputs(rec: Recording, runner, outs, call_args, static) -> None:
    if type(outs) in (list, tuple) and all(not isinstance(o, (list, tuple, dict)) for o in outs):
        flat, rec.spec = list(outs), type(outs)  # the common case, rebuilt without pytree
    else:
        flat, rec.spec = pytree.tree_flatten(outs)
    inputs = {}
    for i, a in enumerate(call_args):
        if isinstance(a, torch.Tensor):
            inputs.setdefault(a.untyped_storage().data_ptr(), i)
    groups: dict = {}
    storages = []
    for o in flat:
        if not isinstance(o, torch.Tensor):
            rec.plan.append((CONST, o))
            continue
        if not runner.api.is_graph_tensor(o):
            raise RuntimeError(f"the graph returns a tensor on {o.device}, whose value a replay would not update")
        if o.untyped_storage().nbytes() == 0:
            rec.plan.append((EMPTY, o))
            continue
        ptr = o.untyped_storage().data_ptr()
        i = inputs.get(ptr)
        if i is not None:
            a = call_args[i]
            delta = o.storage_offset() - a.storage_offset()
            rec.plan.append((INPUT, (i, tuple(o.shape), tuple(o.stride()), delta, o is a)))
            if i not in static:
                rec.alias_dynamic.add(i)
            continue
        g = groups.get(ptr)
        if g is None:
            g = groups[ptr] = len(groups)
            storages.append(o.untyped_storage())
            rec.group_flat.append(torch.empty(0, dtype=torch.uint8, device=o.device).set_(o.untyped_storage()))
        rec.plan.append((OUT, len(rec.outs)))
        rec.outs.append(o)
        rec.group_of.append(g)
    n = len(storages)
    rec.mode, rec.copy_refs, rec.clean = [ALIAS] * n, [None] * n, [0] * n
    rec.entries = rec.pool.register(rec.seq, storages, rec)
