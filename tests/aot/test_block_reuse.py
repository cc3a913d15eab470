"""ember/aot/blocks.py: each distinct repeated block is traced once and its nodes copied into the
whole graph. The oracle is eager PyTorch (outputs, gradients, buffers) and the same compile with the
pass off (``config.aot_block_reuse``): the graphs must hold the same ops, and aot_eager's results
must be bit for bit those of tracing every layer."""
from __future__ import annotations

import collections

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ember
from ember.aot import blocks
from tests.aot.block_helpers import (  # noqa: F401 - template_traces: a fixture
    ConvStack, LayerStack, Stack, against_eager, check, conv_x, run, same_running_stats, template_traces, x16,
)


@pytest.mark.parametrize("train", [False, True])
def test_identical_layers_traced_once(train):
    check(lambda: Stack(n=4), x16, train, copies=8 if train else 4)


def test_dropout_draws_as_tracing_every_layer():
    # the copies keep eager's order of random draws: bit for bit the graph of every layer traced
    check(lambda: Stack(n=3, p=0.3), x16, True, copies=6)


def test_a_layer_that_differs_gets_its_own_block():
    def model():
        m = Stack(n=5)
        m.layers[2].scale = 0.5  # a float attribute baked into the graph: another structure
        return m
    stats = against_eager(model, x16, True)[3]
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
    stats = against_eager(model, x16, train)[3]
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


class MutStack(LayerStack):
    def __init__(self, d=16, n=3):
        super().__init__(MutatingBlock, d, n)


@pytest.mark.parametrize("train", [False, True])
def test_mutating_block_is_traced_in_place(train):
    _, _, _, stats, m = against_eager(MutStack, x16, train)
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


class InPlaceStack(LayerStack):
    def __init__(self, d=16, n=3, into_input=False):
        super().__init__(lambda d: InPlaceBlock(d, into_input), d, n)
        self.inp = nn.Linear(d, d)

    def forward(self, x):
        return super().forward(self.inp(x))


@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("into_input", [False, True])
def test_in_place_writes_inside_a_block(into_input, train, template_traces):
    # writes into the block's own values are functionalized in its template: copies; a write into
    # (a view of) its input is found by the template's trace and refused: traced in place
    stats = against_eager(lambda: InPlaceStack(into_input=into_input), x16, train)[3]
    assert len(template_traces) == 1, template_traces
    if into_input:
        assert not stats["copies"] and stats["refused"] == 1, stats
    else:
        assert stats["copies"] == (6 if train else 3) and not stats["refused"], stats


class TrainingConvStack(ConvStack):
    """Stays in training mode when ``run`` asks for eval: an inference graph (no_grad) that writes
    the running statistics."""

    def eval(self):
        return self


@pytest.mark.parametrize("mode", ["eval", "train", "train_no_grad"])
def test_batch_norm_blocks(mode, template_traces):
    # training: the running statistics (graph inputs) are written, which the joint trace that
    # copies templates does not take, so nothing is planned; under no_grad the forward trace takes
    # it, but a block kind writing its running statistics would be refused after its trace, so it
    # is not traced alone (the trace is never made: template_traces counts it); eval: copies
    model = TrainingConvStack if mode == "train_no_grad" else ConvStack
    _, _, _, stats, m = against_eager(model, conv_x, mode == "train")
    if mode == "eval":
        assert stats["copies"] == 3 and len(template_traces) == 1
        return
    if mode == "train":
        assert not template_traces and stats == {"input_writes": 1}, stats
    else:
        assert not template_traces and not stats["templates"] and not stats["copies"] and stats["refused"], stats
    same_running_stats(m, ConvStack, conv_x)


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
    stats = against_eager(AliasStack, x16, train)[3]
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
    stats = against_eager(lambda: NoGradLayers(n=5), x16, True)[3]
    # layer 2 reads a value computed without gradients, layers 3 and 4 one that needs them: only
    # those two are copies of one block (forward and backward)
    assert stats["copies"] == 4


def test_off_switch_and_symbolic_sizes():
    out, _, _, stats, _ = run(lambda: Stack(n=3), x16, False, reuse=False)
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

    check(Wrapped, lambda: torch.randint(0, 64, (1, 8)), train, copies=6 if train else 3)


def test_native_backend_matches_eager():
    stats = against_eager(lambda: Stack(n=3), x16, True, backend="ember")[3]
    assert stats["copies"] == 6
