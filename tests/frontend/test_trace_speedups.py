"""The frontend's trace speedups change nothing it produces: each model is traced with every speedup
on and with each one off (the golden: the code path without it), and the graph's code, every
node's example value (sizes, strides, offset, dtype, device, requires_grad, view-ness, storage
bytes) and the generated entry (its guards) must be the same text. Multi-layer models, so the
repeated layers take the replayed paths (the tests check that they did)."""
import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ember
from ember.config import config
from ember.frontend import convert, fake_memo

# each speedup's switch: off gives the golden (config fields; see each one's doc)
SWITCHES = ("frontend_fake_memo",)


def _meta(v):
    if isinstance(v, torch.Tensor):
        return (tuple(v.shape), v.stride(), v.storage_offset(), v.dtype, str(v.device), v.requires_grad,
                v._is_view(), v.untyped_storage().nbytes(), v.is_leaf, type(v).__name__)
    if isinstance(v, (tuple, list)):
        return tuple(_meta(x) for x in v)
    return repr(v)


def capture(make, args, switches: dict, monkeypatch, kwargs=None, grad=True):
    """Trace ``make()`` (a fresh model or function) on ``args`` with ``switches``; the text of what
    the frontend produced, and how often the fake memo replayed."""
    entries, hits = [], [0]
    real_compile, real_replay = convert._compile, fake_memo.FakeMemo.replay

    def compile_(*a, **k):
        e = real_compile(*a, **k)
        entries.append(e)
        return e

    def replay(self, key, fake_args):
        out = real_replay(self, key, fake_args)
        hits[0] += out is not None
        return out
    monkeypatch.setattr(convert, "_compile", compile_)
    monkeypatch.setattr(fake_memo.FakeMemo, "replay", replay)
    monkeypatch.setattr(config, "frontend_cache", False)  # (a second trace must not load the first's entry)
    for name, value in switches.items():
        monkeypatch.setattr(config, name, value)
    ember.reset()
    torch.manual_seed(0)
    fn = make()
    with torch.set_grad_enabled(grad):
        out = ember.compile(fn, backend="eager")(*args, **(kwargs or {}))
    monkeypatch.undo()
    text = []
    for e in entries:
        text.append(re.sub(r"__ember_entry_\d+|entry \d+|EmberGraph\d+", "#", e.source))
        if e.graph is not None:
            text.append(e.graph.code)
            text.extend(f"{n.name}: {_meta(n.meta.get('example_value'))}" for n in e.graph.graph.nodes)
    return "\n".join(text), hits[0], out


def check_same(make, args, monkeypatch, kwargs=None, grad=True, min_hits=1):
    fast, hits, out = capture(make, args, {s: True for s in SWITCHES}, monkeypatch, kwargs, grad)
    assert hits >= min_hits, f"the repeated layers did not replay ({hits} replays)"
    for off in SWITCHES:
        slow, slow_hits, slow_out = capture(make, args, {s: s != off for s in SWITCHES}, monkeypatch, kwargs, grad)
        assert fast == slow, f"{off} changed what the frontend produced"
        if off == "frontend_fake_memo":
            assert slow_hits == 0
    return out


class Block(nn.Module):
    """A layer touching the memo's edge cases: views, aliasing, in-place, a written argument."""

    def __init__(self, d):
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)
        self.bn = nn.BatchNorm1d(d)

    def forward(self, x):
        h = self.lin(self.norm(x))
        h = h + h  # the same tensor twice
        h = h * x  # two tensors of the same metadata
        v = h.view(h.shape[0], 2, -1).transpose(1, 2)  # views are propagated, never replayed
        h = v.reshape(h.shape) + h[:, :1]
        h = self.bn(h)  # training: writes the running statistics (an argument): never replayed
        h.relu_()  # in place: returns its argument
        with torch.autocast("cpu", dtype=torch.bfloat16):
            a = self.lin(h)  # the same call under autocast: another dtype, another key
        return h + self.lin(h) + a.float()


class Stack(nn.Module):
    def __init__(self, d=8, n=4):
        super().__init__()
        self.layers = nn.ModuleList(Block(d) for _ in range(n))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.mark.parametrize("grad", [False, True])
def test_block_stack(monkeypatch, grad):
    x = torch.randn(4, 8, requires_grad=grad)
    check_same(Stack, (x,), monkeypatch, grad=grad, min_hits=20)


def test_autocast_and_grad_mode_keys(monkeypatch):
    """The same call in and out of autocast and no_grad: the memo must key the modes."""
    def make():
        w = torch.randn(8, 8, requires_grad=True)

        def f(x):
            outs = []
            for _ in range(2):
                outs.append(F.linear(x, w))
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    outs.append(F.linear(x, w))
                with torch.no_grad():
                    outs.append(F.linear(x, w))
            return [o.float() * 1 for o in outs]
        return f
    out = check_same(make, (torch.randn(3, 8),), monkeypatch)
    assert [o.dtype for o in out] == [torch.float32] * 6
    assert [o.requires_grad for o in out] == [True, True, False] * 2


def _llama(n):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=n, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=64, max_position_embeddings=32)
    cfg._attn_implementation = "sdpa"
    return transformers.LlamaForCausalLM(cfg)


def _gpt2(n):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_embd=32, n_layer=n, n_head=4, vocab_size=64, n_positions=32)
    cfg._attn_implementation = "sdpa"
    return transformers.GPT2LMHeadModel(cfg)


@pytest.mark.parametrize("model", [_llama, _gpt2])
@pytest.mark.parametrize("train", [False, True])
def test_transformers(monkeypatch, model, train):
    ids = torch.randint(0, 64, (1, 8))

    def make():
        m = model(3)
        return m.train() if train else m.eval()
    kwargs = {"labels": ids} if train else {}
    check_same(make, (ids,), monkeypatch, kwargs=kwargs, grad=train)


def test_inference_mode_traces_one_graph():
    """Under torch.inference_mode the tensors have no version counter: the memo keys nothing there
    (reading one raised inside the trace, and every call became a graph break)."""
    import ember
    from ember.diagnostics import counters
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(10, 10), torch.nn.SiLU(), torch.nn.Linear(10, 2)).eval()
    x = torch.randn(4, 10)
    with torch.inference_mode():
        expected = model(x)
        ember.reset()
        before = counters.compiled_snapshot()
        fast = ember.compile(model, fullgraph=True)
        for _ in range(2):
            out = fast(x)
    assert (counters.compiled_snapshot() - before)["graphs_compiled"] == 1
    torch.testing.assert_close(out, expected)
