"""Whole models trained through ``backend="aot_eager"``: outputs, gradients and buffers match eager
(per-dtype tolerances), dropout included (same seed, same masks), and a 20-step AdamW loop follows
the eager loss curve. Models are tiny and built from configs: nothing is downloaded."""
import copy

import pytest
import torch
from torch import nn

import ember
from aot_helpers import assert_same_buffers, assert_same_grads, close, train_step_pair
from ember.backends.registry import lookup_backend


class CountingAotEager:
    """``aot_eager`` that also counts the graphs it was given (so a test notices a model that silently
    ran eagerly because the frontend gave up on it)."""

    def __init__(self):
        self.graphs = 0
        self.inner = lookup_backend("aot_eager")
        self.compiled = []

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        self.compiled.append(self.inner(gm, example_inputs))
        assert not self.eager_variants(), self.eager_variants()
        return self.compiled[-1]

    def eager_variants(self):
        return [v.reason for c in self.compiled for v in c.variants.values() if v.kind == "eager"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_mlp(dtype):
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4)).to(dtype)
    x = torch.randn(8, 16, dtype=dtype)
    backend = CountingAotEager()
    ref, test, ref_loss, loss, _ = train_step_pair(model, lambda m: m(x).float().pow(2).mean(), backend=backend)
    assert backend.graphs == 1
    close(loss, ref_loss)
    assert_same_grads(ref, test)


def test_cnn_with_batchnorm_and_dropout():
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(0.3),
        nn.Conv2d(8, 8, 3, stride=2), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout2d(0.2),
        nn.Flatten(), nn.Linear(8 * 7 * 7, 10),
    ).train()
    x = torch.randn(4, 3, 16, 16)
    backend = CountingAotEager()
    ref, test, ref_loss, loss, _ = train_step_pair(model, lambda m: m(x).logsumexp(-1).mean(), backend=backend)
    assert backend.graphs == 1
    close(loss, ref_loss)
    assert_same_grads(ref, test)
    assert_same_buffers(ref, test)
    # a second step (cached graph) with another seed: still the eager masks and statistics
    compiled = ember.compile(test, backend=backend)
    for m in (ref, test):
        m.zero_grad()
    torch.manual_seed(11)
    ref(x).sum().backward()
    torch.manual_seed(11)
    compiled(x).sum().backward()
    assert_same_grads(ref, test)
    assert_same_buffers(ref, test)


def test_transformer_block():
    model = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, batch_first=True).train()
    x = torch.randn(2, 6, 32)
    backend = CountingAotEager()
    ref, test, ref_loss, loss, _ = train_step_pair(model, lambda m: m(x).pow(2).mean(), backend=backend)
    assert backend.graphs == 1
    close(loss, ref_loss)
    assert_same_grads(ref, test)


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=32, bos_token_id=0,
                     eos_token_id=0)
    return GPT2LMHeadModel(cfg).train()


def _bert():
    from transformers import BertConfig, BertForMaskedLM
    cfg = BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                     vocab_size=100, max_position_embeddings=32)
    return BertForMaskedLM(cfg).train()


def _lm_loss(model, ids):
    # the loss is computed outside the model: passing labels makes the frontend run HF's loss helper
    # eagerly (a graph break), which would leave nothing for this test to check
    logits = model(input_ids=ids).logits
    return nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


@pytest.mark.parametrize("build", [_gpt2, _bert], ids=["gpt2", "bert"])
def test_hf_model(build):
    model = build()
    ids = torch.randint(0, 100, (2, 16))
    backend = CountingAotEager()
    ref, test, ref_loss, loss, _ = train_step_pair(model, lambda m: _lm_loss(m, ids), backend=backend)
    assert backend.graphs >= 1
    close(loss, ref_loss)
    assert_same_grads(ref, test)


def test_adamw_loss_curve_matches_eager():
    torch.manual_seed(0)
    model = _gpt2()
    twin = copy.deepcopy(model)
    backend = CountingAotEager()
    compiled = ember.compile(twin, backend=backend)
    opts = [torch.optim.AdamW(m.parameters(), lr=3e-3, weight_decay=0.01) for m in (model, twin)]
    ids = torch.randint(0, 100, (2, 16))  # one batch, memorised: the loss must fall
    curves = ([], [])
    for step in range(20):
        for k, (m, opt) in enumerate(((model, opts[0]), (compiled, opts[1]))):
            torch.manual_seed(100 + step)   # same dropout masks on both sides
            opt.zero_grad(set_to_none=True)
            loss = _lm_loss(m, ids)
            loss.backward()
            opt.step()
            curves[k].append(loss.item())
    assert backend.graphs >= 1
    eager, compiled_curve = torch.tensor(curves[0]), torch.tensor(curves[1])
    assert eager[-1] < eager[0]  # it did train
    torch.testing.assert_close(compiled_curve, eager, rtol=1e-3, atol=1e-4)
    # Adam divides by sqrt(v): near-zero gradients that differ in the last bits move a weight by up to
    # ~lr per step, so the weights get a looser tolerance than the loss curve
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-3, atol=1e-3)
