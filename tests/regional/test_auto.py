"""The automatic choice of regional compilation (``config.regional_auto_block_params``), and
regional compilation of a Hugging Face Llama (its rotary embedding's ``autocast(enabled=False)``
span lies in the glue before the layers)."""
from __future__ import annotations

import pytest
import torch

import ember
from ember.backends import regional

from .models import Block, Tiny

BLOCK_PARAMS = sum(p.numel() for p in Block(32).parameters())  # Tiny's layer (dim 32)


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    regional._SHARED.clear()
    monkeypatch.setattr(ember.config, "regional_compile", False)  # the default: only the automatic choice
    yield
    regional._SHARED.clear()


def _splits(layers, threshold, monkeypatch, **compile_kw):
    monkeypatch.setattr(ember.config, "regional_auto_block_params", threshold)
    torch.manual_seed(0)
    m = Tiny(layers=layers)
    idx = torch.randint(0, 64, (2, 8))
    ref = m(idx)
    ref.sum().backward()
    ref_grads = [p.grad.clone() for p in m.parameters()]
    m.zero_grad(set_to_none=True)
    before = regional.stats()
    out = ember.compile(m, backend="aot_eager", **compile_kw)(idx)
    out.sum().backward()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for p, g in zip(m.parameters(), ref_grads):
        torch.testing.assert_close(p.grad, g, rtol=1e-5, atol=1e-5)
    return (regional.stats() - before)["splits"]


def test_large_blocks_called_often_compile_regionally(monkeypatch):
    assert _splits(regional.AUTO_MIN_CALLS, BLOCK_PARAMS, monkeypatch) == 1


@pytest.mark.parametrize("layers, threshold", [
    (regional.AUTO_MIN_CALLS, BLOCK_PARAMS + 1),       # blocks too small
    (regional.AUTO_MIN_CALLS - 1, BLOCK_PARAMS),       # too few calls
    (regional.AUTO_MIN_CALLS, 0),                      # the automatic choice off
])
def test_small_or_few_blocks_stay_whole(layers, threshold, monkeypatch):
    assert _splits(layers, threshold, monkeypatch) == 0


def test_the_regional_option_false_opts_out(monkeypatch):
    assert _splits(regional.AUTO_MIN_CALLS, BLOCK_PARAMS, monkeypatch, options={"regional": False}) == 0


def test_the_automatic_choice_is_off_by_default(monkeypatch):
    # (measured: the 1B Llama's training step ran 1.20x slower regional on the H100, see config's doc)
    assert ember.config.regional_auto_block_params == 0
    assert _splits(regional.AUTO_MIN_CALLS, ember.config.regional_auto_block_params, monkeypatch) == 0


def test_hf_llama_compiles_one_layer_and_matches_eager(monkeypatch):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=64, max_position_embeddings=32)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    m = transformers.LlamaForCausalLM(cfg)
    ids = torch.randint(0, 64, (1, 8))
    ref = m(ids, labels=ids)
    ref.loss.backward()
    ref_grads = [p.grad.clone() for p in m.parameters()]
    m.zero_grad(set_to_none=True)
    before = regional.stats()
    out = ember.compile(m, backend="aot_eager", options={"regional": True})(ids, labels=ids)
    out.loss.backward()
    seen = regional.stats() - before
    assert seen["splits"] == 1 and seen["reuses"] == 2, seen  # one layer compiled, the other two reuse it
    torch.testing.assert_close(out.logits, ref.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.loss, ref.loss, rtol=1e-5, atol=1e-5)
    for p, g in zip(m.parameters(), ref_grads):
        torch.testing.assert_close(p.grad, g, rtol=1e-5, atol=1e-5)


def test_no_automatic_choice_under_torch_distributed(monkeypatch):
    monkeypatch.setattr(regional, "_distributed", lambda: True)
    assert _splits(regional.AUTO_MIN_CALLS, BLOCK_PARAMS, monkeypatch) == 0


def test_inference_graphs_stay_whole_unless_asked(monkeypatch):
    monkeypatch.setattr(ember.config, "regional_auto_block_params", BLOCK_PARAMS)
    m = Tiny(layers=regional.AUTO_MIN_CALLS).eval()
    idx = torch.randint(0, 64, (2, 8))
    counts = []
    for inference in (False, True):
        monkeypatch.setattr(regional, "AUTO_INFERENCE", inference)
        ember.reset()
        before = regional.stats()
        with torch.no_grad():
            out = ember.compile(m, backend="aot_eager")(idx)
            torch.testing.assert_close(out, m(idx), rtol=1e-5, atol=1e-5)
        counts.append((regional.stats() - before)["splits"])
    assert counts == [0, 1]
