"""A regional inference graph replays whole as one CUDA graph (ember/cudagraphs/split_replay.py), and
masks built from sizes in the glue are simplified before the split (ember/backends/regional.py).

On CPU the fake CUDA API (tests/cudagraphs/fake_cuda.py) stands in for torch.cuda: its "capture"
records the ATen ops run, a replay runs them again into the captured outputs and runs no Python, and
captured outputs are poisoned with NaN, so a wrong replay shows as a wrong value against eager.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ember
from ember.aot import aot_autograd
from ember.aot import mask_simplify
from ember.backends import regional
from ember.cudagraphs import auto, split_replay
from tests.cudagraphs.fake_cuda import FakeCuda

from .models import Block, Tiny

KEY = ("ember", None)


@pytest.fixture
def fake(monkeypatch):
    import ember.cudagraphs as cg
    cg.reset()
    regional._SHARED.clear()
    api = FakeCuda()
    monkeypatch.setattr(split_replay, "API", lambda: api)
    yield api
    cg.reset()
    regional._SHARED.clear()


def _backend(api, wrapped: list):
    """ember's regional pass in front of the autograd layer, whose inference graphs go to the
    default-mode automatic decision (compiled as they are, no code generator), as the ember backend
    has it; returns what the pass returns (kept in ``wrapped``)."""
    inference = auto.wrap_auto(lambda g, ex: g.forward, api=api)
    compiler = aot_autograd(fw_compiler=lambda g, ex: g.forward, inference_compiler=inference)

    def backend(gm, example_inputs):
        out = regional.with_regions(compiler, KEY, True)(gm, example_inputs)
        wrapped.append(out)
        return out
    return backend


def _calls(model, compiled, n=8, vocab=64, shape=(2, 8)):
    torch.manual_seed(0)
    for _ in range(n):
        idx = torch.randint(0, vocab, shape)
        with torch.no_grad():
            ref = model(idx)
            out = compiled(idx)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_a_regional_inference_graph_replays_whole_and_matches_eager(fake):
    m = Tiny(layers=4).eval()
    wrapped = []
    c = ember.compile(m, backend=_backend(fake, wrapped))
    _calls(m, c)
    assert isinstance(wrapped[0], split_replay.SplitReplay)
    names = [d for d in auto.DECISIONS if d[0] == wrapped[0].name]
    assert names and names[-1][1] is True, names  # measured host-bound (the fake device takes no time)
    assert fake.captures == 1 and fake.replays >= 2


def test_outputs_a_caller_holds_are_not_overwritten(fake):
    m = Tiny(layers=4).eval()
    c = ember.compile(m, backend=_backend(fake, []))
    torch.manual_seed(1)
    xs = [torch.randint(0, 64, (2, 8)) for _ in range(8)]
    with torch.no_grad():
        refs = [m(x) for x in xs]
        outs = [c(x) for x in xs]  # every output held until the end
    for out, ref in zip(outs, refs):
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


class Counting(Block):
    """A block that writes a buffer of its own in place at every call."""

    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls.add_(1)
        return super().forward(x)


def test_a_part_writing_its_input_runs_part_by_part(fake):
    torch.manual_seed(0)
    m = Tiny(blocks=[Counting() for _ in range(4)]).eval()
    ref_model = Tiny(blocks=[Counting() for _ in range(4)]).eval()
    ref_model.load_state_dict(m.state_dict())
    wrapped = []
    c = ember.compile(m, backend=_backend(fake, wrapped))
    _calls(ref_model, c, n=6)
    assert isinstance(wrapped[0], split_replay.SplitReplay)
    assert wrapped[0].decision[0] is False and "writes" in wrapped[0].decision[1]
    assert fake.captures == 0
    assert [float(b.calls) for b in m.layers] == [float(b.calls) for b in ref_model.layers] == [6.0] * 4


def test_training_graphs_are_left_part_by_part(fake):
    m = Tiny(layers=4)
    wrapped = []
    c = ember.compile(m, backend=_backend(fake, wrapped))
    idx = torch.randint(0, 64, (2, 8))
    c(idx).sum().backward()
    assert isinstance(wrapped[0], torch.fx.GraphModule) and fake.captures == 0


def test_off_with_auto_cudagraphs(fake, monkeypatch):
    monkeypatch.setattr(ember.config, "auto_cudagraphs", False)
    m = Tiny(layers=4).eval()
    wrapped = []
    c = ember.compile(m, backend=_backend(fake, wrapped))
    _calls(m, c, n=3)
    assert isinstance(wrapped[0], torch.fx.GraphModule) and fake.captures == 0


def test_other_compilers_and_modes_are_not_replayed(fake):
    split = torch.fx.GraphModule(nn.Module(), torch.fx.Graph())
    x = torch.zeros(2)
    for key in (("ember", "max-autotune-no-cudagraphs"), ("aot_eager", None), None):
        assert split_replay.wrap(split, [x], key, api=fake) is split


class MaskedBlock(Block):
    def forward(self, x, mask):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (y.view(b, t, self.heads, c // self.heads).transpose(1, 2) for y in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class CausalByMask(Tiny):
    """As Hugging Face models do under a compiler: the causal mask built once from sizes, then passed
    to every layer."""

    def forward(self, idx):
        x = self.emb(idx)
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        mask = (pos[None, :] <= pos[:, None])[None, None]
        for layer in self.layers:
            x = layer(x, mask)
        return self.head(self.ln(x))


def test_a_size_only_mask_made_in_the_glue_becomes_is_causal_in_every_block(fake):
    m = CausalByMask(blocks=[MaskedBlock() for _ in range(4)]).eval()
    before = dict(mask_simplify.STATS)
    wrapped = []
    c = ember.compile(m, backend=_backend(fake, wrapped))
    _calls(m, c, n=4)
    split = wrapped[0].split
    assert mask_simplify.STATS["causal"] - before["causal"] == 4  # one per block, before the split
    # the glue hands the blocks no mask: each block's call takes the hidden state and its weights only
    calls = [n for n in split.graph.nodes if n.op == "call_module"]
    assert all(not any(a.op == "call_module" and a.target != calls[i - 1].target for a in n.all_input_nodes)
               for i, n in enumerate(calls) if i)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_regional_inference_replays_whole_and_matches_eager():
    import ember.cudagraphs as cg
    regional._SHARED.clear()
    torch.manual_seed(0)
    m = CausalByMask(blocks=[MaskedBlock() for _ in range(6)]).cuda().eval()
    c = ember.compile(m, options={"regional": True})
    before = cg.stats()["replays"]
    for _ in range(10):
        idx = torch.randint(0, 64, (2, 8), device="cuda")
        with torch.no_grad():
            torch.testing.assert_close(c(idx), m(idx), rtol=2e-3, atol=2e-3)
    splits = [d for d in auto.DECISIONS if d[0].startswith("split#")]
    assert splits and splits[-1][1] is True, splits
    assert cg.stats()["replays"] > before
    held = []
    for _ in range(4):  # outputs held across calls: never overwritten (the runner copies, or stops replaying)
        idx = torch.randint(0, 64, (2, 8), device="cuda")
        with torch.no_grad():
            held.append((m(idx), c(idx)))
    for ref, out in held:
        torch.testing.assert_close(out, ref, rtol=2e-3, atol=2e-3)
