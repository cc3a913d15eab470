"""Models and checks shared by the block-reuse tests (test_block_reuse.py, test_block_families.py)
and the frontend's trace-speedup tests: layers stacked in an ``nn.ModuleList``, and a compile with
ember/aot/blocks.py on compared against eager PyTorch and against the same compile with the pass off
(``config.aot_block_reuse``)."""
from __future__ import annotations

import collections
import contextlib

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ember
from ember.aot import blocks
from ember.config import config


class LayerStack(nn.Module):
    """``n`` layers ``block(d)`` in ``self.layers``, each applied to the previous one's output."""

    def __init__(self, block, d: int, n: int):
        super().__init__()
        self.layers = nn.ModuleList(block(d) for _ in range(n))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class Block(nn.Module):
    def __init__(self, d, p=0.0, scale=1.0):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)
        self.p, self.scale = p, scale

    def forward(self, x, gate):
        h = self.fc2(F.gelu(self.fc(self.ln(x))))
        return x + F.dropout(h, self.p, self.training) * gate * self.scale


class Stack(nn.Module):
    def __init__(self, d=16, n=4, **kw):
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.layers = nn.ModuleList(Block(d, **kw) for _ in range(n))
        self.head = nn.Linear(d, 3)

    def forward(self, x):
        h = self.inp(x)
        gate = torch.sigmoid(h.mean())  # read by every block: its gradient sums over them
        for layer in self.layers:
            h = layer(h, gate)
        return self.head(h)


class ConvBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x))) + x


class ConvStack(LayerStack):
    def __init__(self, c=4, n=3):
        super().__init__(ConvBlock, c, n)

    def forward(self, x):
        return super().forward(x).mean((2, 3))


def conv_x():
    return torch.randn(2, 4, 6, 6)


def same_running_stats(m, model_fn, inputs_fn):
    """``m``'s batch-norm layers hold the running statistics of one eager training call of a fresh
    ``model_fn()`` on ``inputs_fn()`` (both seeded as ``run`` seeds them)."""
    torch.manual_seed(0)
    twin = model_fn()
    twin(inputs_fn())
    for a, b in zip(m.layers, twin.layers):
        torch.testing.assert_close(a.bn.running_mean, b.bn.running_mean)
        torch.testing.assert_close(a.bn.running_var, b.bn.running_var)
        assert a.bn.num_batches_tracked == b.bn.num_batches_tracked


def run(model_fn, inputs_fn, train: bool, reuse: bool, seed=0, backend=None, ctx=contextlib.nullcontext):
    """(outputs, grads, ops per traced graph, blocks.STATS delta, model) of a fresh compile; ``backend``:
    None records the traced ATen graphs and runs them as they are (aot_eager), else ember.compile's;
    ``ctx()`` is entered around the forward call (the backward runs outside it, as autocast asks)."""
    ember.reset()
    torch.manual_seed(seed)
    m = model_fn()
    if not train:
        m.eval()
    graphs: list = []
    before = collections.Counter(blocks.STATS)
    old = config.aot_block_reuse, config.aot_cache
    config.aot_block_reuse, config.aot_cache = reuse, False  # (traced here, not loaded from an earlier test)
    try:
        cm = ember.compile(m, backend=_aot_backend(graphs) if backend is None else backend)
        out, grads = _call(cm, m, inputs_fn, train, seed, ctx)
    finally:
        config.aot_block_reuse, config.aot_cache = old
    ops = [collections.Counter(str(n.target) for n in g.graph.nodes if n.op == "call_function") for g in graphs]
    return out, grads, ops, collections.Counter(blocks.STATS) - before, m


def _call(fn, m, inputs_fn, train: bool, seed, ctx):
    """(output, m's gradients) of ``fn`` (``m`` or its compile) on fresh inputs, seeded, under
    ``ctx()``: in training with the backward of the output's squares, else under no_grad."""
    x = inputs_fn()
    torch.manual_seed(seed + 1)
    if train:
        with ctx():
            out = fn(x)
        out.float().square().sum().backward()
        return out.detach(), _grads(m)
    with torch.no_grad(), ctx():
        return fn(x).detach(), []


def _grads(m):
    return [None if p.grad is None else p.grad.clone() for p in m.parameters()]


def _same_grads(grads, ref, **tol):
    assert [g is None for g in grads] == [r is None for r in ref]
    for g, r in zip(grads, ref):
        if g is not None:
            torch.testing.assert_close(g, r, **tol)


def _aot_backend(graphs):
    from ember.aot import aot_autograd

    def record(g, _inputs):
        graphs.append(g)
        return None
    return aot_autograd(fw_compiler=record, bw_compiler=record, inference_compiler=record)


def _eager(model_fn, inputs_fn, train: bool, seed=0, ctx=contextlib.nullcontext):
    torch.manual_seed(seed)
    m = model_fn()
    if not train:
        m.eval()
    return _call(m, m, inputs_fn, train, seed, ctx)


def against_eager(model_fn, inputs_fn, train: bool, tol: float = 1e-5, backend=None, ctx=contextlib.nullcontext):
    """Compile (the pass on) and run the model, run it eagerly, and compare the outputs (rtol = atol =
    tol) and, for training, the parameters' gradients (rtol 10 * tol, atol tol). Returns ``run``'s
    tuple: (outputs, grads, ops per graph, blocks.STATS delta, model)."""
    got = run(model_fn, inputs_fn, train, reuse=True, backend=backend, ctx=ctx)
    ref, ref_grads = _eager(model_fn, inputs_fn, train, ctx=ctx)
    torch.testing.assert_close(got[0], ref, rtol=tol, atol=tol)
    _same_grads(got[1], ref_grads, rtol=10 * tol, atol=tol)
    return got


def check(model_fn, inputs_fn, train: bool, copies: int | None, tol: float = 1e-5, ctx=contextlib.nullcontext):
    """``against_eager``, then the same compile with the pass off: the same ops per graph and, on
    aot_eager, bit for bit the same outputs and gradients; ``copies`` calls were copied."""
    out, grads, ops, stats, _ = against_eager(model_fn, inputs_fn, train, tol=tol, ctx=ctx)
    out0, grads0, ops0, stats0, _ = run(model_fn, inputs_fn, train, reuse=False, ctx=ctx)
    assert not stats0, "the pass ran while switched off"
    if copies is None:
        assert not stats["copies"]
    else:
        assert stats["copies"] == copies, stats
    # the same ops as tracing every layer, and the same numbers (aot_eager runs the traced ATen graphs)
    assert [sum(c.values()) for c in ops] and len(ops) == len(ops0)
    for c, c0 in zip(ops, ops0):
        extra = {k: v for k, v in (c - c0).items() if k not in ("aten.clone.default", "aten.zeros.default")}
        assert not extra and not (c0 - c), (c - c0, c0 - c)
    torch.testing.assert_close(out, out0, rtol=0, atol=0)
    _same_grads(grads, grads0, rtol=0, atol=0)
    return stats


def x16():
    return torch.randn(2, 5, 16)


@pytest.fixture
def template_traces(monkeypatch):
    """The in_specs of every block traced alone (``blocks._trace_template`` calls), while the test runs:
    STATS counts only the templates that were kept, not those traced and then refused."""
    calls: list = []
    real = blocks._trace_template

    def counted(part, in_specs, *args, **kwargs):
        calls.append(in_specs)
        return real(part, in_specs, *args, **kwargs)
    monkeypatch.setattr(blocks, "_trace_template", counted)
    return calls
