"""A dimension that was 1 at an earlier compile and becomes symbolic is traced size-obliviously
(ember/frontend/dynamic.py, size_one.py): a sweep of sizes that starts at 1 and comes back to 1 costs
one recompile, and where the graph depends on the size being 1 (squeeze, a user branch, a broadcast)
the guard still rejects 1. Eager PyTorch is the oracle at every size."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ember
from ember.config import config


def _compiles(fn) -> int:
    return fn._ember_cache.compile_count


def _run(c, f, *xs):
    torch.testing.assert_close(c(*xs), f(*xs), equal_nan=True)


class _Block(nn.Module):
    """Embedding, layer norm, causal attention and an MLP over (batch, seq) token ids."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.ln = nn.LayerNorm(16)
        self.qkv = nn.Linear(16, 48)
        self.mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))

    def forward(self, ids):
        h = self.emb(ids)
        b, s, _ = h.shape
        q, k, v = self.qkv(self.ln(h)).view(b, s, 3, 2, 8).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, 16)
        h = h + a
        return h + self.mlp(self.ln(h))


SWEEP = [(1, 4), (2, 6), (4, 8), (3, 10), (1, 12), (5, 14), (1, 16), (2, 18), (6, 20), (1, 22)]


@pytest.mark.parametrize("backend", ["aot_eager", "ember"])
def test_batch_sweep_from_one_compiles_twice(backend):
    torch.manual_seed(0)
    m = _Block().eval()
    c = ember.compile(m, backend=backend)
    with torch.no_grad():
        for b, s in SWEEP:
            ids = torch.randint(0, 50, (b, s))
            torch.testing.assert_close(c(ids), m(ids), rtol=1e-5, atol=1e-5)
    assert _compiles(c) == 2, c._ember_cache.recompile_reasons
    # the second entry serves batch 1 (its guard starts the batch at 1, the sequence at 2)
    dynamic = [e.source for e in c._ember_cache.entries if "__sym_s" in e.source]
    assert len(dynamic) == 1 and ">= 1" in dynamic[0]


def test_switch_off_keeps_one_specialized(monkeypatch):
    monkeypatch.setattr(config, "size_oblivious_ones", False)
    f = lambda x: x * 2 + x.sum(0)  # noqa: E731
    c = ember.compile(f, backend="eager")
    for b, s in [(1, 3), (2, 4), (1, 5)]:
        _run(c, f, torch.randn(b, s))
    assert _compiles(c) == 3


# functions whose result at size 1 differs from the general rule: the dynamic graph must not serve 1
DEPENDS_ON_ONE = {
    "squeeze_dim": lambda x: x.squeeze(0) * 2,
    "squeeze_all": lambda x: x.squeeze() + 1,
    "user_branch": lambda x: x * 3 if x.size(0) == 1 else x * 2,
}
# functions that are the same rule at 1: the dynamic graph serves 1
GENERAL = {
    "reductions": lambda x: x.softmax(0) + x.sum(0, keepdim=True) + x.max(0).values,
    "std": lambda x: x.std(0),  # nan at 1, in eager too
    "outer": lambda x: (x.unsqueeze(1) * x.unsqueeze(0)).sum(1),
    "reshape": lambda x: x.reshape(-1, 2).sum(1),
    "matmul": lambda x: (x @ x.t()).sum(0),
    "expand": lambda x: x[:, :1].expand(x.shape[0], 5) * x.sum(1, keepdim=True),
}


@pytest.mark.parametrize("backend", ["aot_eager", "ember"])
@pytest.mark.parametrize("name", sorted(DEPENDS_ON_ONE))
def test_graph_depending_on_one_rejects_one(backend, name):
    f = DEPENDS_ON_ONE[name]
    c = ember.compile(f, backend=backend)
    for b, s in [(1, 4), (2, 6), (1, 8), (3, 10), (1, 12)]:
        _run(c, f, torch.randn(b, s))  # (1, 8): the sequence changed too, so only a dynamic entry fits
    assert _compiles(c) == 3, c._ember_cache.recompile_reasons
    assert "x.size(0)" in c._ember_cache.recompile_reasons[1]


@pytest.mark.parametrize("backend", ["aot_eager", "ember"])
@pytest.mark.parametrize("name", sorted(GENERAL))
def test_general_graph_serves_one(backend, name):
    f = GENERAL[name]
    c = ember.compile(f, backend=backend)
    for b, s in [(1, 4), (2, 6), (1, 8), (3, 10), (1, 12)]:
        _run(c, f, torch.randn(b, s))
    assert _compiles(c) == 2, c._ember_cache.recompile_reasons


def test_broadcast_only_at_one_is_never_reused_wrongly():
    # x's batch broadcasts against y's only when it is 1: the dynamic graph traced at x.size(0) == 3
    # ties it to y.size(0), so x of batch 1 must not take it
    f = lambda x, y: (x + y) * 2  # noqa: E731
    c = ember.compile(f, backend="ember")
    for bx, s in [(1, 4), (3, 5), (1, 6), (3, 7)]:
        _run(c, f, torch.randn(bx, s), torch.randn(3, s))
    # two symbols that were both 1: (1, 1) -> (2, 2) ties them; (1, 3) broadcasts
    g = ember.compile(f, backend="ember")
    for bx, by, s in [(1, 1, 4), (2, 2, 5), (1, 3, 6), (3, 1, 7), (1, 1, 8), (4, 4, 9)]:
        _run(g, f, torch.randn(bx, s), torch.randn(by, s))


@pytest.mark.parametrize("renderer", ["cpp", "triton"])
def test_native_kernels_serve_size_one_without_rebuilding(native_cache, monkeypatch, renderer):
    # sizes are kernel arguments: C++ kernels, and Triton's (in the interpreter here), built once
    pytest.importorskip("triton")
    from ember.native.backend import COUNTERS

    monkeypatch.setattr(config, "native_force_triton", renderer == "triton")
    f = lambda x: torch.softmax(x * 2, -1) + x.mean(0)  # noqa: E731
    c = ember.compile(f, backend="ember")
    _run(c, f, torch.randn(1, 4))
    start = dict(COUNTERS)
    _run(c, f, torch.randn(2, 6))
    assert COUNTERS["graphs"] == start["graphs"] + 1  # the dynamic graph, generated (fresh cache)
    before = dict(COUNTERS)
    for b, s in [(1, 8), (3, 10), (1, 12), (5, 3)]:
        _run(c, f, torch.randn(b, s))
    assert _compiles(c) == 2
    assert COUNTERS == before  # no graph, kernel or per-size copy generated for the new sizes


def test_training_from_batch_one_matches_eager():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.Tanh(), nn.Linear(8, 2))
    twin = ember.compile(m, backend="aot_eager")
    for b in (1, 3, 1, 4):
        x = torch.randn(b, 6)
        m.zero_grad()
        ref = m(x).pow(2).sum()
        ref.backward()
        grads = [p.grad.clone() for p in m.parameters()]
        m.zero_grad()
        out = twin(x).pow(2).sum()
        out.backward()
        torch.testing.assert_close(out, ref)
        for p, g in zip(m.parameters(), grads):
            torch.testing.assert_close(p.grad, g)
    assert _compiles(twin) == 2


def test_grad_mode_and_autocast_in_the_graph_leave_global_state_alone():
    def f(x):
        with torch.no_grad():
            y = x * 2
        with torch.autocast("cpu", dtype=torch.bfloat16):
            z = y @ y.t()
        return y + 1, z

    c = ember.compile(f, backend="aot_eager")
    for b, s in [(1, 4), (2, 6), (1, 8), (3, 10)]:
        x = torch.randn(b, s)
        for got, want in zip(c(x), f(x)):
            torch.testing.assert_close(got, want)
        assert torch.is_grad_enabled() and not torch.is_autocast_enabled("cpu")
