"""ember/aot/blocks.py: each distinct repeated block is traced once and its nodes copied into the
whole graph. The oracle is eager PyTorch (outputs, gradients, buffers) and the same compile with the
pass off (``config.aot_block_reuse``): the graphs must hold the same ops, and aot_eager's results
must be bit for bit those of tracing every layer."""
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


def _run(model_fn, inputs_fn, train: bool, reuse: bool, seed=0, backend=None, ctx=contextlib.nullcontext):
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
        x = inputs_fn()
        torch.manual_seed(seed + 1)
        if train:
            with ctx():
                out = cm(x)
            out.float().square().sum().backward()
            grads = _grads(m)
        else:
            with torch.no_grad(), ctx():
                out = cm(x)
            grads = []
    finally:
        config.aot_block_reuse, config.aot_cache = old
    ops = [collections.Counter(str(n.target) for n in g.graph.nodes if n.op == "call_function") for g in graphs]
    return out.detach(), grads, ops, collections.Counter(blocks.STATS) - before, m


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
    x = inputs_fn()
    torch.manual_seed(seed + 1)
    if train:
        with ctx():
            out = m(x)
        out.float().square().sum().backward()
        return out.detach(), _grads(m)
    with torch.no_grad(), ctx():
        return m(x), []


def _against_eager(model_fn, inputs_fn, train: bool, tol: float = 1e-5, backend=None, ctx=contextlib.nullcontext):
    """Compile (the pass on) and run the model, run it eagerly, and compare the outputs (rtol = atol =
    tol) and, for training, the parameters' gradients (rtol 10 * tol, atol tol). Returns ``_run``'s
    tuple: (outputs, grads, ops per graph, blocks.STATS delta, model)."""
    got = _run(model_fn, inputs_fn, train, reuse=True, backend=backend, ctx=ctx)
    ref, ref_grads = _eager(model_fn, inputs_fn, train, ctx=ctx)
    torch.testing.assert_close(got[0], ref, rtol=tol, atol=tol)
    _same_grads(got[1], ref_grads, rtol=10 * tol, atol=tol)
    return got


def _check(model_fn, inputs_fn, train: bool, copies: int | None, tol: float = 1e-5, ctx=contextlib.nullcontext):
    out, grads, ops, stats, _ = _against_eager(model_fn, inputs_fn, train, tol=tol, ctx=ctx)
    out0, grads0, ops0, stats0, _ = _run(model_fn, inputs_fn, train, reuse=False, ctx=ctx)
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


def _x():
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


@pytest.mark.parametrize("train", [False, True])
def test_identical_layers_traced_once(train):
    _check(lambda: Stack(n=4), _x, train, copies=8 if train else 4)


def test_dropout_draws_as_tracing_every_layer():
    # the copies keep eager's order of random draws: bit for bit the graph of every layer traced
    _check(lambda: Stack(n=3, p=0.3), _x, True, copies=6)


def test_a_layer_that_differs_gets_its_own_block():
    def model():
        m = Stack(n=5)
        m.layers[2].scale = 0.5  # a float attribute baked into the graph: another structure
        return m
    stats = _against_eager(model, _x, True)[3]
    assert stats["copies"] == 8  # the 4 identical layers, forward and backward; layer 2 traced in place


@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("odd", [(2,), (1, 3)], ids=["one_differs", "two_differ"])
def test_one_trace_per_repeated_kind(train, odd, template_traces):
    # 4 identical layers and the differing ones (another float attribute: another structure). Each
    # kind that repeats is traced alone exactly once and every call of it is a copy; a kind called
    # once is traced in place (tracing it alone would gain nothing). Fails with the pass off (no
    # trace) or with calls of one kind told apart (a trace per call, or none).
    n = 4 + len(odd)

    def model():
        m = Stack(n=n)
        for i in odd:
            m.layers[i].scale = 0.5
        return m
    stats = _against_eager(model, _x, train)[3]
    kinds = 1 if len(odd) == 1 else 2
    copied = 4 if len(odd) == 1 else n
    assert len(template_traces) == kinds and stats["templates"] == kinds, (template_traces, stats)
    assert stats["copies"] == copied * (2 if train else 1) and stats["plans"] == 1, stats
    assert not stats["in_place"] and not stats["refused"], stats


class MutatingBlock(nn.Module):
    """Writes a buffer (a running count): a block that mutates an input is never copied."""

    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls.add_(1)
        return torch.relu(self.fc(x)) + x


class MutStack(nn.Module):
    def __init__(self, d=16, n=3):
        super().__init__()
        self.layers = nn.ModuleList(MutatingBlock(d) for _ in range(n))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.mark.parametrize("train", [False, True])
def test_mutating_block_is_traced_in_place(train):
    _, _, _, stats, m = _against_eager(MutStack, _x, train)
    assert not stats["copies"]
    assert all(layer.calls.item() == 1 for layer in m.layers)


class InPlaceBlock(nn.Module):
    """Writes in place into values it made (a ResNet's ReLU(inplace=True)), or into a view of its
    input (``into_input``: the caller's tensor changes)."""

    def __init__(self, d, into_input=False):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.into_input = into_input

    def forward(self, x):
        if self.into_input:
            x[..., :4].mul_(0.5)
        h = self.fc(x)
        h.mul_(2)
        h = F.relu(h, inplace=True)
        return h + x


class InPlaceStack(nn.Module):
    def __init__(self, d=16, n=3, into_input=False):
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.layers = nn.ModuleList(InPlaceBlock(d, into_input) for _ in range(n))

    def forward(self, x):
        x = self.inp(x)
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("into_input", [False, True])
def test_in_place_writes_inside_a_block(into_input, train, template_traces):
    # writes into the block's own values are functionalized in its template: copies; a write into
    # (a view of) its input is found by the template's trace and refused: traced in place
    stats = _against_eager(lambda: InPlaceStack(into_input=into_input), _x, train)[3]
    assert len(template_traces) == 1, template_traces
    if into_input:
        assert not stats["copies"] and stats["refused"] == 1, stats
    else:
        assert stats["copies"] == (6 if train else 3) and not stats["refused"], stats


class ConvBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x))) + x


class ConvStack(nn.Module):
    def __init__(self, c=4, n=3):
        super().__init__()
        self.layers = nn.ModuleList(ConvBlock(c) for _ in range(n))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x.mean((2, 3))


class TrainingConvStack(ConvStack):
    """Stays in training mode when ``_run`` asks for eval: an inference graph (no_grad) that writes
    the running statistics."""

    def eval(self):
        return self


@pytest.mark.parametrize("mode", ["eval", "train", "train_no_grad"])
def test_batch_norm_blocks(mode, template_traces):
    # training: the running statistics (graph inputs) are written, which the joint trace that
    # copies templates does not take, so nothing is planned; under no_grad the forward trace takes
    # it, but a block kind writing its running statistics would be refused after its trace, so it
    # is not traced alone (the trace is never made: template_traces counts it); eval: copies
    x = lambda: torch.randn(2, 4, 6, 6)  # noqa: E731
    model = TrainingConvStack if mode == "train_no_grad" else ConvStack
    _, _, _, stats, m = _against_eager(model, x, mode == "train")
    if mode == "eval":
        assert stats["copies"] == 3 and len(template_traces) == 1
        return
    if mode == "train":
        assert not template_traces and stats == {"input_writes": 1}, stats
    else:
        assert not template_traces and not stats["templates"] and not stats["copies"] and stats["refused"], stats
    torch.manual_seed(0)
    twin = ConvStack()
    twin(x())
    for a, b in zip(m.layers, twin.layers):
        torch.testing.assert_close(a.bn.running_mean, b.bn.running_mean)
        torch.testing.assert_close(a.bn.running_var, b.bn.running_var)
        assert a.bn.num_batches_tracked == b.bn.num_batches_tracked


class AliasBlock(nn.Module):
    """Returns a view of its input next to a fresh value: refused (an alias cannot be a copy's output)."""

    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        y = torch.tanh(self.fc(x)) * 2 + 1
        return y, x.transpose(-1, -2)


class AliasStack(nn.Module):
    def __init__(self, d=16, n=3):
        super().__init__()
        self.layers = nn.ModuleList(AliasBlock(d) for _ in range(n))

    def forward(self, x):
        acc = 0
        for layer in self.layers:
            x, t = layer(x)
            acc = acc + t.sum(-2)
        return x.sum(-1) + acc


@pytest.mark.parametrize("train", [False, True])
def test_block_returning_an_alias_is_traced_in_place(train):
    stats = _against_eager(AliasStack, _x, train)[3]
    assert not stats["copies"] and stats["refused"]


class NoGradLayers(Stack):
    def forward(self, x):
        h = self.inp(x)
        gate = torch.sigmoid(h.mean())
        with torch.no_grad():  # frozen layers: traced in place, under the graph's own grad mode
            for layer in self.layers[:2]:
                h = layer(h, gate)
        for layer in self.layers[2:]:
            h = layer(h, gate)
        return self.head(h)


def test_layers_under_no_grad_inside_the_graph():
    stats = _against_eager(lambda: NoGradLayers(n=5), _x, True)[3]
    # layer 2 reads a value computed without gradients, layers 3 and 4 one that needs them: only
    # those two are copies of one block (forward and backward)
    assert stats["copies"] == 4


def test_off_switch_and_symbolic_sizes():
    out, _, _, stats, _ = _run(lambda: Stack(n=3), _x, False, reuse=False)
    assert not stats
    ember.reset()
    m = Stack(n=3).eval()
    before = collections.Counter(blocks.STATS)
    cm = ember.compile(m, backend="aot_eager", dynamic=True, options=None)
    with torch.no_grad():
        for n in (3, 5):
            x = torch.randn(2, n, 16)
            torch.testing.assert_close(cm(x), m(x))
    assert not (collections.Counter(blocks.STATS) - before)["copies"]


@pytest.mark.parametrize("train", [False, True])
def test_llama_layers(train):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=64, max_position_embeddings=32)
    cfg._attn_implementation = "sdpa"

    class Wrapped(nn.Module):
        def __init__(self):
            super().__init__()
            self.m = transformers.LlamaForCausalLM(cfg)

        def forward(self, ids):
            return self.m(ids).logits

    _check(Wrapped, lambda: torch.randint(0, 64, (1, 8)), train, copies=6 if train else 3)


def test_native_backend_matches_eager():
    stats = _against_eager(lambda: Stack(n=3), _x, True, backend="ember")[3]
    assert stats["copies"] == 6
