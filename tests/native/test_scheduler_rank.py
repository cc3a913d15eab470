"""The scheduler's bounded reachability (``Scheduler._reaches`` searching only up to the
destination's ``rank``, kept topological by ``_rerank``) decides exactly as an unbounded search:
same kernels, same members, on a deep graph with vertical, horizontal and tiny-pair fusion."""
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.native import lowering, scheduler
from ember.native.options import NativeOptions


def _block(x, w, b):
    h = torch.nn.functional.layer_norm(x, x.shape[-1:])
    h = torch.relu(h @ w + b) * torch.sigmoid(h)
    s = torch.softmax(h, -1) + h.mean(-1, keepdim=True)
    return x + s, s.sum() * 0.5


def _model(x, w, b):
    acc = x.new_zeros(())
    for _ in range(6):  # repeated layers: far-apart candidates (shared w, b) and long chains
        x, t = _block(x, w, b)
        acc = acc + t
    return x, acc


def _unbounded(self, src, dst, skip_direct):
    stack = [g for g in self._succ(src) if g is not dst] if skip_direct else [src]
    seen = set()
    while stack:
        g = stack.pop()
        if g is dst:
            return True
        if id(g) in seen:
            continue
        seen.add(id(g))
        stack.extend(self._succ(g))
    return False


def _kernels(monkeypatch, reference):
    args = (torch.randn(4, 16), torch.randn(16, 16), torch.randn(16))
    gm = make_fx(_model)(*args)
    g, _ = lowering.lower(gm, list(args))
    checks = []
    if reference:
        monkeypatch.setattr(scheduler.Scheduler, "_reaches", _unbounded)
    else:
        merge = scheduler.Scheduler._merge

        def checked_merge(self, a, b, shape):
            merge(self, a, b, shape)
            live = [grp for grp in self.by_rank if grp is not None]
            assert set(live) == self.live and [grp.rank for grp in live] == sorted(grp.rank for grp in live)
            for grp in live:  # every edge points to a later rank
                assert all(s.rank > grp.rank for s in self._succ(grp)), "rank is not a topological order"
            checks.append(1)
        monkeypatch.setattr(scheduler.Scheduler, "_merge", checked_merge)
    sched = scheduler.schedule(g, NativeOptions())
    monkeypatch.undo()
    out = [[n.name for n in s.nodes] if isinstance(s, scheduler.Kernel) else s.name for s in sched.steps]
    return out, len(checks)


def test_bounded_reachability_fuses_as_the_unbounded_search(monkeypatch):
    ref, _ = _kernels(monkeypatch, reference=True)
    new, merges = _kernels(monkeypatch, reference=False)
    assert merges >= 10  # the graph exercises fusion
    assert new == ref


def _steps(monkeypatch, memo: bool):
    args = (torch.randn(4, 16), torch.randn(16, 16), torch.randn(16))
    g, _ = lowering.lower(make_fx(_model)(*args), list(args))
    asked = []
    inner = scheduler.Scheduler._can_merge

    def counted(self, a, b):
        asked.append(1)
        return inner(self, a, b)
    monkeypatch.setattr(scheduler.Scheduler, "_can_merge", counted)
    if not memo:
        monkeypatch.setattr(scheduler.Scheduler, "can_merge", counted)
    sched = scheduler.schedule(g, NativeOptions())
    monkeypatch.undo()
    return [[n.name for n in s.nodes] if isinstance(s, scheduler.Kernel) else s.name for s in sched.steps], len(asked)


def test_remembered_refusals_fuse_as_asking_again(monkeypatch):
    """``can_merge`` remembers a refused pair until either group grows: the same kernels as checking
    every candidate anew, with fewer checks."""
    ref, asked_ref = _steps(monkeypatch, memo=False)
    new, asked = _steps(monkeypatch, memo=True)
    assert new == ref
    assert asked < asked_ref
