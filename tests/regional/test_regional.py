"""Regional compilation (ember/backends/regional.py): repeated blocks compile once, results exact.

``regional.stats()`` says how much was compiled: ``compiles`` (parts the backend compiled),
``reuses`` (parts that took a callable compiled before), ``splits`` (graphs split).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import ember
from ember.backends import regional

from .models import Block, Tiny

BACKENDS = ["eager", "aot_eager", "ember"]


@pytest.fixture(autouse=True)
def _fresh_shared_table():
    regional._SHARED.clear()  # a part compiled by an earlier test would be a reuse here
    saved = ember.config.regional_compile
    ember.config.regional_compile = True  # (off by default)
    yield
    ember.config.regional_compile = saved
    regional._SHARED.clear()


def _run(model, idx, train=True):
    out = model(idx)
    grads = None
    if train:
        out.sum().backward()
        grads = [p.grad.clone() if p.grad is not None else None for p in model.parameters()]
        model.zero_grad(set_to_none=True)
    return out.detach(), grads


def _compiled_run(model, idx, train=True, **kw):
    before = regional.stats()
    c = ember.compile(model, **kw)
    out = c(idx)
    grads = None
    if train:
        out.sum().backward()
        grads = [p.grad.clone() if p.grad is not None else None for p in model.parameters()]
        model.zero_grad(set_to_none=True)
    return out.detach(), grads, regional.stats() - before


def _close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_identical_layers_compile_one_block_and_match_eager(backend):
    m = Tiny(layers=4)
    idx = torch.randint(0, 64, (2, 8))
    ref, ref_grads = _run(m, idx)
    out, grads, seen = _compiled_run(m, idx, backend=backend)
    _close(out, ref)
    for g, r in zip(grads, ref_grads):
        _close(g, r)
    # parts: the glue before the layers, one layer (compiled once, reused by the other three), the glue after
    assert seen["splits"] == 1
    assert seen["compiles"] == 3
    assert seen["reuses"] == 3


def test_12_and_24_layers_compile_the_same_number_of_parts():
    idx = torch.randint(0, 64, (2, 8))
    counts = []
    for n in (12, 24):
        regional._SHARED.clear()
        m = Tiny(layers=n)
        ref, _ = _run(m, idx, train=False)
        out, _, seen = _compiled_run(m, idx, train=False, backend="aot_eager")
        _close(out, ref)
        counts.append((seen["compiles"], seen["reuses"]))
    assert counts == [(3, 11), (3, 23)]


def test_layers_that_differ_get_their_own_entries():
    # two kinds repeated (other hidden size; other head count: an int attribute), two one-offs
    # (another dropout probability; another submodule type), and the plain block twice
    odd = Block()
    odd.ln2 = nn.Identity()
    blocks = [Block(), Block(hidden=64), Block(heads=2), Block(), Block(hidden=64), Block(heads=2),
              Block(p=0.5), odd]
    m = Tiny(blocks=blocks).eval()  # eval: dropout is the identity, outputs comparable
    idx = torch.randint(0, 64, (2, 8))
    ref, ref_grads = _run(m, idx)
    out, grads, seen = _compiled_run(m, idx, backend="aot_eager")
    _close(out, ref)
    for g, r in zip(grads, ref_grads):
        _close(g, r)
    # each repeated kind: compiled once, reused once; the one-offs stay with the glue after them
    assert seen["reuses"] == 3
    keys = set(regional._SHARED)
    assert seen["compiles"] == len(keys)


def test_dropout_probability_is_part_of_the_key():
    m = Tiny(blocks=[Block(p=0.0), Block(p=0.5), Block(p=0.0), Block(p=0.5)]).eval()
    idx = torch.randint(0, 64, (2, 8))
    ref, _ = _run(m, idx, train=False)
    out, _, seen = _compiled_run(m, idx, train=False, backend="eager")
    _close(out, ref)
    assert seen["reuses"] == 2  # p=0.0 twice, p=0.5 twice: two blocks compiled


def test_opt_out_compiles_the_graph_whole():
    m = Tiny(layers=4)
    idx = torch.randint(0, 64, (2, 8))
    ref, ref_grads = _run(m, idx)
    out, grads, seen = _compiled_run(m, idx, backend="aot_eager", options={"regional": False})
    _close(out, ref)
    assert seen["splits"] == 0 and seen["compiles"] == 0
    saved = ember.config.regional_compile
    ember.config.regional_compile = False
    try:
        out, grads, seen = _compiled_run(m, idx, backend="aot_eager")
    finally:
        ember.config.regional_compile = saved
    _close(out, ref)
    assert seen["splits"] == 0 and seen["compiles"] == 0


def test_regional_option_must_be_a_bool():
    with pytest.raises(TypeError, match="regional"):
        ember.compile(lambda x: x, options={"regional": "no"})


def test_compiling_each_layer_shares_one_compiled_block():
    m = Tiny(layers=4)
    idx = torch.randint(0, 64, (2, 8))
    ref, ref_grads = _run(m, idx)
    before = regional.stats()
    for i, layer in enumerate(m.layers):
        m.layers[i] = ember.compile(layer, backend="aot_eager")
    out, grads = _run(m, idx)
    seen = regional.stats() - before
    _close(out, ref)
    for g, r in zip(grads, ref_grads):
        _close(g, r)
    assert seen["compiles"] == 1 and seen["reuses"] == 3


class NormBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.bn = nn.BatchNorm1d(8)

    def forward(self, x):
        return torch.relu(self.bn(self.lin(x))) + x


def test_buffers_mutated_inside_a_shared_block_are_updated_per_instance():
    torch.manual_seed(0)
    eager = nn.Sequential(*[NormBlock() for _ in range(3)])
    comp = nn.Sequential(*[NormBlock() for _ in range(3)])
    comp.load_state_dict(eager.state_dict())
    x = torch.randn(4, 8)
    ref = eager(x)
    before = regional.stats()
    out = ember.compile(comp, backend="aot_eager")(x)
    seen = regional.stats() - before
    _close(out, ref)
    for a, b in zip(eager.modules(), comp.modules()):
        if isinstance(a, nn.BatchNorm1d):
            _close(b.running_mean, a.running_mean)
            _close(b.running_var, a.running_var)
            assert int(b.num_batches_tracked) == int(a.num_batches_tracked)
    # the first block reads the graph's input (a leaf needing no gradient), the others an
    # intermediate: two keys, the third block reuses the second's
    assert seen["reuses"] == 1


class NoGradTiny(Tiny):
    def forward(self, idx):
        x = self.emb(idx)
        for i, layer in enumerate(self.layers):
            if i == 1:
                with torch.no_grad():
                    x = layer(x)
            else:
                x = layer(x)
        return self.head(self.ln(x))


def test_a_graph_that_switches_grad_mode_is_compiled_whole():
    m = NoGradTiny(layers=3)
    idx = torch.randint(0, 64, (2, 8))
    ref, ref_grads = _run(m, idx)
    out, grads, seen = _compiled_run(m, idx, backend="aot_eager")
    _close(out, ref)
    for g, r in zip(grads, ref_grads):
        assert (g is None) == (r is None)
        if g is not None:
            _close(g, r)
    assert seen["splits"] == 0


class _Wrapper(nn.Module):
    """A forward that only calls the module it wraps (a loss wrapper): the same nodes, no second call."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, idx):
        return self.inner(idx)


def test_a_wrapper_around_the_model_is_not_a_repeated_block():
    # before, the wrapper's call and the model's call had the same structure (the same nodes) and
    # counted as two calls: the whole graph became one "region" and the layers were not shared
    m = _Wrapper(Tiny(layers=4))
    idx = torch.randint(0, 64, (2, 8))
    ref, ref_grads = _run(m, idx)
    out, grads, seen = _compiled_run(m, idx, backend="aot_eager")
    _close(out, ref)
    for g, r in zip(grads, ref_grads):
        _close(g, r)
    assert (seen["splits"], seen["compiles"], seen["reuses"]) == (1, 3, 3), seen


class _Norm(nn.Module):
    """An RMSNorm: several ops, called inside each layer and once after them (as in a Llama)."""

    def __init__(self, dim=32):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


class _NormBlock(nn.Module):
    def __init__(self, dim=32):
        super().__init__()
        self.norm = _Norm(dim)
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        return x + torch.tanh(self.fc(self.norm(x)))


class _NormStack(nn.Module):
    def __init__(self, layers=4, dim=32, vocab=64):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList([_NormBlock(dim) for _ in range(layers)])
        self.norm = _Norm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx):
        x = self.emb(idx)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def test_a_block_repeated_only_inside_the_regions_stays_in_the_glue():
    # the final norm has the structure of the norms inside each layer, but is the only such call
    # outside them: a part of its own would be compiled for that one call (and not fused with the head)
    m = _NormStack()
    idx = torch.randint(0, 64, (2, 8))
    ref, ref_grads = _run(m, idx)
    out, grads, seen = _compiled_run(m, idx, backend="aot_eager")
    _close(out, ref)
    for g, r in zip(grads, ref_grads):
        _close(g, r)
    assert (seen["splits"], seen["compiles"], seen["reuses"]) == (1, 3, 3), seen  # glue, layer, glue
