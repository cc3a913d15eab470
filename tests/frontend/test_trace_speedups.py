"""The frontend's trace speedups change nothing it produces: each model is traced with every speedup
on and with each one off (the golden: the code path without it), and the graph's code, every
node's example value (sizes, strides, offset, dtype, device, requires_grad, view-ness, storage
bytes) and the generated entry (its guards) must be the same text. Multi-layer models, so the
repeated layers take the replayed paths (the tests check that they did)."""
import contextlib
import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ember
from ember.config import config
from ember.frontend import convert, fake_memo
from tests.aot.block_helpers import LayerStack

# each speedup's switch: off gives the golden (config fields; see each one's doc)
SWITCHES = ("frontend_fake_memo",)


def _meta(v):
    if isinstance(v, torch.Tensor):
        return (tuple(v.shape), v.stride(), v.storage_offset(), v.dtype, str(v.device), v.requires_grad,
                v._is_view(), v.untyped_storage().nbytes(), v.is_leaf, type(v).__name__)
    if isinstance(v, (tuple, list)):
        return tuple(_meta(x) for x in v)
    return repr(v)


def capture(make, args, switches: dict, monkeypatch, kwargs=None, grad=True, around=(contextlib.nullcontext,)):
    """Trace ``make()`` (a fresh model or function) on ``args`` with ``switches``, called once inside
    each context of ``around`` (another state: a recompile); the text of what the frontend produced,
    how often the fake memo replayed, and the last call's result."""
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
    compiled = ember.compile(fn, backend="eager")
    for ctx in around:
        with torch.set_grad_enabled(grad), ctx():
            out = compiled(*args, **(kwargs or {}))
    monkeypatch.undo()
    text = []
    for e in entries:
        text.append(re.sub(r"__ember_entry_\d+|entry \d+|EmberGraph\d+", "#", e.source))
        if e.graph is not None:
            text.append(e.graph.code)
            text.extend(f"{n.name}: {_meta(n.meta.get('example_value'))}" for n in e.graph.graph.nodes)
    return "\n".join(text), hits[0], out


def check_same(make, args, monkeypatch, kwargs=None, grad=True, min_hits=1, around=(contextlib.nullcontext,)):
    fast, hits, out = capture(make, args, {s: True for s in SWITCHES}, monkeypatch, kwargs, grad, around)
    assert hits >= min_hits, f"the repeated layers did not replay ({hits} replays)"
    for off in SWITCHES:
        slow, slow_hits, slow_out = capture(make, args, {s: s != off for s in SWITCHES}, monkeypatch, kwargs, grad, around)
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


@pytest.mark.parametrize("grad", [False, True])
def test_block_stack(monkeypatch, grad):
    x = torch.randn(4, 8, requires_grad=grad)
    check_same(lambda: LayerStack(Block, 8, 4), (x,), monkeypatch, grad=grad, min_hits=20)


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


# ---- state that changes an op's result: between two identical calls, and across recompiles -------
@contextlib.contextmanager
def _default_dtype(dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


@contextlib.contextmanager
def _flash_sdp(enabled):
    old = torch.backends.cuda.flash_sdp_enabled()
    torch.backends.cuda.enable_flash_sdp(enabled)
    try:
        yield
    finally:
        torch.backends.cuda.enable_flash_sdp(old)


@contextlib.contextmanager
def _mkldnn_attr(enabled):
    old = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = enabled
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = old


def _sdpa_args():
    # (batch, length, heads, dim) seen as (batch, heads, length, dim), as transformers hand it in: the
    # flash kernel's output keeps that layout, the math kernel's is contiguous (other strides)
    return (torch.randn(2, 8, 4, 16).transpose(1, 2),)


def _sdpa(q):
    return F.scaled_dot_product_attention(q, q, q)


def _conv_args():
    return torch.randn(1, 3, 8, 8).to(memory_format=torch.channels_last), torch.randn(4, 3, 3, 3)


def _linear_args():
    return torch.randn(3, 8), torch.randn(8, 8, requires_grad=True)


def _switches():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return {
        # name: (the context, the op, its arguments)
        "default_dtype": (lambda: _default_dtype(torch.float64), lambda x: x / 2, lambda: (torch.arange(4),)),
        "sdpa_kernel_math": (lambda: sdpa_kernel(SDPBackend.MATH), _sdpa, _sdpa_args),
        "sdpa_kernel_flash": (lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION), _sdpa, _sdpa_args),
        "sdpa_kernel_mem_efficient": (lambda: sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]), _sdpa,
                                      _sdpa_args),
        "enable_flash_sdp": (lambda: _flash_sdp(False), _sdpa, _sdpa_args),
        "mkldnn_flags": (lambda: torch.backends.mkldnn.flags(enabled=False), F.conv2d, _conv_args),
        "mkldnn_enabled": (lambda: _mkldnn_attr(False), F.conv2d, _conv_args),
        "cudnn_flags": (lambda: torch.backends.cudnn.flags(enabled=False), F.conv2d, _conv_args),
        "no_grad": (torch.no_grad, F.linear, _linear_args),
        "autocast_bf16": (lambda: torch.autocast("cpu", dtype=torch.bfloat16), F.linear, _linear_args),
        "autocast_fp16": (lambda: torch.autocast("cpu", dtype=torch.float16), F.linear, _linear_args),
    }


def _state():
    """What fake_memo.global_key reads, and the flags themselves (restored after every call)."""
    return (fake_memo.global_key(), torch.backends.cuda.flash_sdp_enabled(), torch.backends.mkldnn.enabled)


def _same_as_eager(out, expected):
    assert len(out) == len(expected)
    for o, e in zip(out, expected):
        assert (o.dtype, o.shape, o.stride(), o.requires_grad) == (e.dtype, e.shape, e.stride(), e.requires_grad)
        torch.testing.assert_close(o, e, rtol=1e-2 if e.dtype in (torch.float16, torch.bfloat16) else 1e-5, atol=1e-3)


@pytest.mark.parametrize("switch", list(_switches()))
def test_state_switched_between_identical_calls(monkeypatch, switch):
    """The same call before, inside and after a context that switches what the op returns: the
    trace (graph code, every node's example value, guards) is the same with the memo on and off,
    and each result is eager's (values, dtype, strides). Switches a graph cannot hold (the default
    dtype, the SDPA / oneDNN / cuDNN flags) are graph breaks: were they run at trace time only, the
    graph ran every call in the caller's state (an SDPA got flash's strides in MATH's context)."""
    ctx, op, args = _switches()[switch]

    def make():
        def f(*a):
            outs = [op(*a), op(*a)]
            with ctx():
                outs += [op(*a), op(*a)]
            outs.append(op(*a))
            return [o * 1 for o in outs]
        return f
    inputs = args()
    before = _state()
    out = check_same(make, inputs, monkeypatch)
    assert _state() == before
    _same_as_eager(out, make()(*inputs))
    assert _state() == before


@pytest.mark.parametrize("switch", list(_switches()))
def test_state_switched_around_the_compiled_call(monkeypatch, switch):
    """The same function called outside the context, inside it (the caller's state: a recompile
    where it is guarded), and outside again: memo on and off trace the same, each result is eager's
    (the graph ops follow the caller's state at run time, as eager's do)."""
    ctx, op, args = _switches()[switch]
    inputs = args()

    def make():
        return lambda *a: [op(*a) * 1, op(*a) * 1]
    for around in ((contextlib.nullcontext, ctx), (ctx, contextlib.nullcontext)):
        out = check_same(make, inputs, monkeypatch, around=around)
        with around[-1]():
            _same_as_eager(out, make()(*inputs))


def test_autocast_dtype_key(monkeypatch):
    """The same call under CPU autocast to bfloat16, then to float16: autocast is on for both, only
    its dtype (in the memo's key) tells the results apart."""
    def make():
        w = torch.randn(8, 8, requires_grad=True)

        def f(x):
            outs = []
            for dtype in (torch.bfloat16, torch.float16, torch.bfloat16):
                with torch.autocast("cpu", dtype=dtype):
                    outs += [F.linear(x, w), F.linear(x, w)]
            return outs
        return f
    out = check_same(make, (torch.randn(3, 8),), monkeypatch, min_hits=3)
    assert [o.dtype for o in out] == [torch.bfloat16] * 2 + [torch.float16] * 2 + [torch.bfloat16] * 2
