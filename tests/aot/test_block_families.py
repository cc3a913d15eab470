"""ember/aot/blocks.py on block families beyond identical layers: weights tied across layers, layers
under activation checkpointing, autocast outside and inside the compiled call, layers taking a Python
scalar or bool, buffers differing by value, layers in train and eval mode in one list. The oracle is
eager PyTorch (outputs and gradients), on aot_eager (the traced ATen graphs as they are; where
``check`` is used also bit for bit the graphs of tracing every layer) and on the default backend
(the native C++ code on CPU). Each test asserts what the pass did (blocks.STATS), so it shows the
path taken: copies of a template, a call traced in place, or no plan at all."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

from tests.aot.block_helpers import (  # noqa: F401 - template_traces: a fixture
    Block, ConvStack, Stack, against_eager, check, conv_x, same_running_stats, template_traces, x16,
)

BACKENDS = [pytest.param(None, id="aot_eager"), pytest.param("ember", id="default")]


def _forward(m, x, call=lambda layer, h, gate, i: layer(h, gate)):
    h = m.inp(x)
    gate = torch.sigmoid(h.mean())
    for i, layer in enumerate(m.layers):
        h = call(layer, h, gate, i)
    return m.head(h)


# --------------------------------------------------------------------------------- tied weights

class Albert(Stack):
    """Distinct layer objects sharing one Linear (its weight's gradient sums over the layers)."""

    def __init__(self, d=16, n=4):
        super().__init__(d, n)
        for layer in self.layers[1:]:
            layer.fc = self.layers[0].fc


class Repeated(Stack):
    """A ModuleList holding one layer object n times (every weight shared)."""

    def __init__(self, d=16, n=4):
        super().__init__(d, n)
        self.layers = nn.ModuleList([self.layers[0]] * n)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("model", [Albert, Repeated])
def test_tied_weights(model, train, backend):
    stats = against_eager(model, x16, train, backend=backend)[3]
    # one template for the four calls: the shared weights are the same graph input in each call
    assert stats["templates"] == 1 and stats["copies"] == (8 if train else 4) and not stats["in_place"], stats
    if backend is None:
        check(model, x16, train, copies=8 if train else 4)  # (bit for bit tracing every layer)


# ----------------------------------------------------------------------------------- checkpoint

class Checkpointed(Stack):
    def forward(self, x):
        return _forward(self, x, lambda layer, h, gate, i: torch.utils.checkpoint.checkpoint(
            layer, h, gate, use_reentrant=False))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("train", [False, True])
def test_checkpointed_layers(train, backend):
    # torch.utils.checkpoint is a graph break (torch._disable_dynamo): each layer runs eagerly
    # between compiled graphs, which hold no repeated block, so the pass plans nothing
    stats = against_eager(Checkpointed, x16, train, backend=backend)[3]
    assert not stats, stats


# -------------------------------------------------------------------------------------- autocast

def _bf16():
    return torch.autocast("cpu", dtype=torch.bfloat16)


class AutocastInside(Stack):
    def forward(self, x):
        h = self.inp(x)
        gate = torch.sigmoid(h.mean())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            for layer in self.layers:
                h = layer(h, gate)
        return self.head(h.float())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("train", [False, True])
def test_autocast_around_the_compiled_call(train, backend):
    # the whole graph and each template are traced under the caller's autocast: copies, whose
    # numbers are those of tracing every layer (bf16 against eager: within bf16's rounding)
    stats = against_eager(Stack, x16, train, tol=2e-2, backend=backend, ctx=_bf16)[3]
    assert stats["templates"] == 1 and stats["copies"] == (8 if train else 4) and not stats["in_place"], stats
    if backend is None:
        check(Stack, x16, train, copies=8 if train else 4, tol=2e-2, ctx=_bf16)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("train", [False, True])
def test_autocast_inside_forward(train, backend):
    # calls inside an autocast span of the graph are left out of the plan (a template is traced
    # in the caller's state): traced in place, nothing planned
    stats = against_eager(AutocastInside, x16, train, tol=2e-2, backend=backend)[3]
    assert not stats["copies"] and not stats["templates"], stats


# ----------------------------------------------------------------------- Python scalars and bools

class ScaledBlock(Block):
    def forward(self, x, gate, k):
        return x + self.fc2(F.gelu(self.fc(self.ln(x)))) * gate * k


class ByIndex(Stack):
    """Each layer scaled by a Python number computed from its index (``step`` apart, ``period``
    distinct values): the frontend bakes it into the graph."""

    def __init__(self, d=16, n=4, period=2):
        super().__init__(d, n)
        self.layers = nn.ModuleList(ScaledBlock(d) for _ in range(n))
        self.period = period

    def forward(self, x):
        return _forward(self, x, lambda layer, h, gate, i: layer(h, gate, float(i % self.period + 1)))


class FlagBlock(Block):
    def forward(self, x, gate, flag: bool):
        h = self.fc2(F.gelu(self.fc(self.ln(x))))
        return x + (h * gate if flag else h - gate)


class ByFlag(Stack):
    def __init__(self, d=16, n=4):
        super().__init__(d, n)
        self.layers = nn.ModuleList(FlagBlock(d) for _ in range(n))

    def forward(self, x):
        return _forward(self, x, lambda layer, h, gate, i: layer(h, gate, i % 2 == 0))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("model,kinds", [(lambda: ByIndex(period=2), 2), (lambda: ByIndex(period=4), 0),
                                         (ByFlag, 2)], ids=["index_mod_2", "index", "flag"])
def test_python_argument_per_layer(model, kinds, train, backend, template_traces):
    # layers whose argument differs are different blocks (the value is a constant of the graph):
    # two values each used twice are two templates of two copies each; four distinct values are
    # four blocks called once, none traced alone
    stats = against_eager(model, x16, train, backend=backend)[3]
    assert len(template_traces) == stats["templates"] == kinds, stats
    assert stats["copies"] == (4 if kinds else 0) * (2 if train else 1) and not stats["in_place"], stats


# ------------------------------------------------------------------------- buffers, train and eval

class BufferBlock(Block):
    def __init__(self, d, k):
        super().__init__(d)
        self.register_buffer("shift", torch.full((d,), float(k)))

    def forward(self, x, gate):
        return x + self.fc2(F.gelu(self.fc(self.ln(x)))) * gate + self.shift


class Buffers(Stack):
    """A registered buffer per layer, each of another value: graph inputs, not the template's constants."""

    def __init__(self, d=16, n=4):
        super().__init__(d, n)
        self.layers = nn.ModuleList(BufferBlock(d, k) for k in range(n))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("train", [False, True])
def test_buffers_differing_by_value(train, backend):
    stats = against_eager(Buffers, x16, train, backend=backend)[3]
    assert stats["templates"] == 1 and stats["copies"] == (8 if train else 4) and not stats["in_place"], stats
    if backend is None:
        check(Buffers, x16, train, copies=8 if train else 4)


def _half_eval(m):
    for layer in m.layers[1::2]:
        layer.eval()
    return m


@pytest.mark.parametrize("backend", BACKENDS)
def test_train_and_eval_layers_with_dropout(backend, template_traces):
    # training, layers 1 and 3 in eval mode: their dropout is off, another structure than the
    # training layers' (drawing): two templates of two calls each, bit for bit tracing every layer
    model = lambda: _half_eval(Stack(n=4, p=0.3))  # noqa: E731
    stats = against_eager(model, x16, True, backend=backend)[3]
    assert len(template_traces) == stats["templates"] == 2 and stats["copies"] == 8, stats
    if backend is None:
        check(model, x16, True, copies=8)


@pytest.mark.parametrize("backend", BACKENDS)
def test_train_and_eval_layers_with_batch_norm(backend, template_traces):
    # training, layers 1 and 3 in eval mode: the training layers write their running statistics,
    # graph inputs, which the joint trace that copies templates does not handle: nothing is planned
    # (no template of the eval layers traced, no whole trace made only to be made again)
    model = lambda: _half_eval(ConvStack(n=4))  # noqa: E731
    _, _, _, stats, m = against_eager(model, conv_x, True, backend=backend)
    assert not template_traces and stats == {"input_writes": 1}, stats
    same_running_stats(m, model, conv_x)


@pytest.mark.parametrize("backend", BACKENDS)
def test_eval_layers_with_batch_norm(backend):
    # the whole model in eval mode (no running statistics written): copies
    stats = against_eager(lambda: ConvStack(n=4), conv_x, False, backend=backend)[3]
    assert stats["templates"] == 1 and stats["copies"] == 4, stats
