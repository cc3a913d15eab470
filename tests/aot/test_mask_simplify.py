"""Size-only attention masks (what Hugging Face models build under a compiler) are dropped or become
``is_causal=True`` (ember/aot/mask_simplify.py); every other mask stays. Eager is the oracle."""
import pytest
import torch
import torch.nn.functional as F

import ember
from ember.aot import mask_simplify

B, H, L, D = 2, 4, 8, 16


def _qkv(S=L, grad=False):
    torch.manual_seed(0)
    q = torch.randn(B, H, L, D, requires_grad=grad)
    k, v = (torch.randn(B, H, S, D, requires_grad=grad) for _ in range(2))
    return q, k, v


def _causal_bool(q, k):  # GPT-2 under a compiler: arange, compare, expand
    qi = torch.arange(q.shape[-2])[:, None]
    ki = torch.arange(k.shape[-2])[None, :]
    return (ki <= qi)[None, None].expand(q.shape[0], -1, -1, -1)


def _causal_float(q, k):
    m = torch.full((q.shape[-2], k.shape[-2]), float("-inf")).triu(1)
    return m[None, None]


def _all_true(q, k):
    return torch.ones(q.shape[0], 1, q.shape[-2], k.shape[-2], dtype=torch.bool)


def _finfo_min(q, k):  # transformers' float masks use the dtype's lowest value
    qi = torch.arange(q.shape[-2])[:, None]
    ki = torch.arange(k.shape[-2])[None, :]
    return torch.where(ki <= qi, 0.0, torch.finfo(torch.float32).min)[None, None]


def _run(mask_fn, S=L, grad=False, **kw):
    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask_fn(q, k), **kw)
    before = dict(mask_simplify.STATS)
    q, k, v = _qkv(S, grad)
    expected = f(q, k, v)
    got = ember.compile(f, fullgraph=True)(q, k, v)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-5)
    if grad:
        g_exp = torch.autograd.grad(expected.sum(), (q, k, v))
        q2, k2, v2 = _qkv(S, grad)
        g_got = torch.autograd.grad(ember.compile(f, fullgraph=True)(q2, k2, v2).sum(), (q2, k2, v2))
        for a, b in zip(g_got, g_exp):
            torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-5)
    return {k: mask_simplify.STATS[k] - before[k] for k in before}


@pytest.mark.parametrize("mask_fn,kind", [(_causal_bool, "causal"), (_causal_float, "causal"),
                                          (_finfo_min, "causal"), (_all_true, "dropped")])
@pytest.mark.parametrize("grad", [False, True])
def test_size_only_masks_are_rewritten_exactly(mask_fn, kind, grad):
    got = _run(mask_fn, grad=grad)
    assert got[kind] >= 1 and got["dropped" if kind == "causal" else "causal"] == 0


def _lower_right(q, k):  # a KV-cache mask: lower-right aligned, which is_causal (upper-left) is not
    L_, S_ = q.shape[-2], k.shape[-2]
    return (torch.arange(S_)[None, :] <= torch.arange(L_)[:, None] + (S_ - L_))[None, None]


def _window(q, k):  # sliding window: a subset of the causal mask
    qi, ki = torch.arange(q.shape[-2])[:, None], torch.arange(k.shape[-2])[None, :]
    return ((ki <= qi) & (ki > qi - 3))[None, None]


def _first_row_masked(q, k):  # strictly lower: row 0 sees nothing (NaN rows must stay NaN)
    qi, ki = torch.arange(q.shape[-2])[:, None], torch.arange(k.shape[-2])[None, :]
    return (ki < qi)[None, None]


def _half_float(q, k):  # -1e4, not -inf: a real additive bias, not a mask
    return torch.full((q.shape[-2], k.shape[-2]), -1e4).triu(1)[None, None]


@pytest.mark.parametrize("mask_fn,S", [(_lower_right, 12), (_window, L), (_first_row_masked, L), (_half_float, L)])
def test_other_masks_stay(mask_fn, S):
    got = _run(mask_fn, S=S)
    assert got == {"dropped": 0, "causal": 0}


def test_a_mask_from_an_input_stays():
    def f(q, k, v, keep):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, None, :].expand(-1, 1, L, -1))
    q, k, v = _qkv()
    keep = torch.ones(B, L, dtype=torch.bool)
    before = dict(mask_simplify.STATS)
    cf = ember.compile(f)
    torch.testing.assert_close(cf(q, k, v, keep), f(q, k, v, keep))
    keep[1, 5:] = False  # (the same compiled graph must honour the new padding)
    torch.testing.assert_close(cf(q, k, v, keep), f(q, k, v, keep))
    assert mask_simplify.STATS == before


def test_a_mask_used_elsewhere_is_kept_for_that_use():
    def f(q, k, v):
        m = _causal_bool(q, k)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m), m.sum()
    q, k, v = _qkv()
    got, expected = ember.compile(f, fullgraph=True)(q, k, v), f(q, k, v)
    torch.testing.assert_close(got[0], expected[0], atol=2e-5, rtol=1e-5)
    assert got[1] == expected[1]


def test_dynamic_shapes_leave_the_mask():
    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=_causal_bool(q, k))
    before = dict(mask_simplify.STATS)
    cf = ember.compile(f, dynamic=True)
    for n in (8, 11):
        q, k, v = (torch.randn(B, H, n, D) for _ in range(3))
        torch.testing.assert_close(cf(q, k, v), f(q, k, v), atol=2e-5, rtol=1e-5)
    assert mask_simplify.STATS == before


def test_hugging_face_gpt2_and_bert_lose_their_built_masks():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64, attn_pdrop=0.0,
                                  resid_pdrop=0.0, embd_pdrop=0.0)
    cfg._attn_implementation = "sdpa"
    gpt2 = transformers.GPT2Model(cfg).eval()
    ids = torch.randint(0, 128, (2, 16))
    before = dict(mask_simplify.STATS)
    with torch.no_grad():
        torch.testing.assert_close(ember.compile(gpt2)(ids).last_hidden_state, gpt2(ids).last_hidden_state,
                                   atol=1e-5, rtol=1e-5)
    assert mask_simplify.STATS["causal"] - before["causal"] == 2  # (one per layer)
    bc = transformers.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                                 vocab_size=128)
    bc._attn_implementation = "sdpa"
    bert = transformers.BertModel(bc).eval()
    am = torch.ones(2, 16, dtype=torch.long)
    am[1, 10:] = 0
    with torch.no_grad():
        torch.testing.assert_close(ember.compile(bert)(ids, attention_mask=am).last_hidden_state,
                                   bert(ids, attention_mask=am).last_hidden_state, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------- with the autograd layer's cache

@pytest.fixture
def aot_cache_dir(tmp_path, monkeypatch):
    from ember.aot import cache as aot_cache
    from ember.config import config
    monkeypatch.setattr(config, "cache_dir", str(tmp_path))
    monkeypatch.setattr(config, "aot_cache", True)
    monkeypatch.setattr(aot_cache, "STATS", dict.fromkeys(aot_cache.STATS, 0))
    return aot_cache


def _sdpa_causal(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=_causal_bool(q, k))


def test_a_graph_loaded_from_the_cache_is_not_analyzed_again(aot_cache_dir, monkeypatch):
    """The rewrite is in the traced graphs a cache entry holds: a compile that loads them (a warm
    process) never evaluates the masks again, and still runs the rewritten attention."""
    q, k, v = _qkv()
    want = _sdpa_causal(q, k, v)
    calls = []
    real = mask_simplify.simplify_attention_masks
    monkeypatch.setattr(mask_simplify, "simplify_attention_masks", lambda gm: calls.append(gm) or real(gm))
    before = dict(mask_simplify.STATS)
    from tests.aot.aot_helpers import Recorder
    graphs = []
    for _ in range(2):  # two compiles, as two processes would do them: nothing shared but the disk
        rec = Recorder()
        got = ember.compile(_sdpa_causal, fullgraph=True, backend=rec)(q, k, v)
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
        (variant,) = rec.variants
        graphs.append(variant.graph)
    assert aot_cache_dir.STATS["stores"] == 1 and aot_cache_dir.STATS["hits"] == 1
    assert len(calls) == 1 and mask_simplify.STATS["causal"] - before["causal"] == 1  # (loaded: not analyzed)
    for g in graphs:  # the loaded graph runs the attention as the traced one does: no mask, is_causal
        (sdpa,) = [n for n in g.graph.nodes if "attention" in str(n.target)]
        assert len(sdpa.all_input_nodes) == 3 and True in sdpa.args, sdpa.format_node()  # (q, k, v; is_causal)
    assert graphs[0].code == graphs[1].code


def test_every_variant_is_keyed_by_the_graph_as_captured(aot_cache_dir):
    """A second variant (here: the call under no_grad after a training call) is built after the
    first one rewrote the graph; its key is still of the captured graph, so a process whose first
    call is that variant (which never rewrote) finds it."""
    q, k, v = _qkv(grad=True)
    cf = ember.compile(_sdpa_causal, fullgraph=True)
    cf(q, k, v).sum().backward()
    with torch.no_grad():
        want = _sdpa_causal(q, k, v)
        torch.testing.assert_close(cf(q, k, v), want, atol=2e-5, rtol=1e-5)
    assert aot_cache_dir.STATS["stores"] == 2 and aot_cache_dir.STATS["hits"] == 0
    with torch.no_grad():
        torch.testing.assert_close(ember.compile(_sdpa_causal, fullgraph=True)(q, k, v), want, atol=2e-5, rtol=1e-5)
    assert aot_cache_dir.STATS["hits"] == 1 and aot_cache_dir.STATS["stores"] == 2


def test_a_changed_mask_is_another_key(aot_cache_dir):
    """The key holds the mask's nodes as captured: a graph whose mask differs (a sliding window, which
    stays a mask) misses and is traced, never given the causal graph's entry."""
    q, k, v = _qkv()
    ember.compile(_sdpa_causal, fullgraph=True)(q, k, v)

    def windowed(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=_window(q, k))
    torch.testing.assert_close(ember.compile(windowed, fullgraph=True)(q, k, v), windowed(q, k, v),
                               atol=2e-5, rtol=1e-5)
    assert aot_cache_dir.STATS["hits"] == 0 and aot_cache_dir.STATS["stores"] == 2
