"""Dropout on CUDA draws eager's random stream through the compiled forward and backward: GPT-2 and
BERT with every dropout on (hidden, attention probabilities inside SDPA), one training step, same
seed on both sides, for ``aot_eager`` and the default backend. GPU only.

BERT is called with an explicit ``attention_mask``. Without one, Hugging Face's mask helper decides
*at run time* whether a mask is needed (``padding_mask.all()``), but only when it sees no compiler;
under any compiler (ember or torch.compile) it always builds the mask. The mask changes which SDPA
kernel runs (memory-efficient with a mask, another without), and each kernel draws its dropout
mask from the generator its own way: same distribution, a different sample. That is a different
program, not a difference in ember's autograd layer, so the test gives both sides the same program.
"""
import copy

import pytest
import torch

import ember

pytestmark = pytest.mark.gpu


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    m = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64,
                                   resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1))
    return m, {}


def _bert():
    from transformers import BertConfig, BertForMaskedLM

    m = BertForMaskedLM(BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                   intermediate_size=128, vocab_size=128, hidden_dropout_prob=0.1,
                                   attention_probs_dropout_prob=0.1))
    mask = torch.ones(2, 16, dtype=torch.long, device="cuda")
    mask[1, -3:] = 0
    return m, {"attention_mask": mask}


@pytest.fixture
def no_tf32():
    old = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = old


@pytest.mark.parametrize("backend", ["aot_eager", "ember"])
@pytest.mark.parametrize("build", [_gpt2, _bert], ids=["gpt2", "bert"])
def test_dropout_training_step_draws_eager_stream(build, backend, no_tf32):
    torch.manual_seed(0)
    model, kwargs = build()
    model = model.cuda().train()
    twin = copy.deepcopy(model)
    compiled = ember.compile(twin, backend=backend)
    ids = torch.randint(0, 128, (2, 16), device="cuda")
    proj = torch.randn(2, 16, 128, generator=torch.Generator().manual_seed(2)).cuda()
    losses = []
    for m in (model, compiled):
        for step in range(2):  # the second step runs the cached graph
            torch.manual_seed(7 + step)
            loss = (m(input_ids=ids, **kwargs).logits.float() * proj).sum()
            loss.backward()
            losses.append(loss.item())
    # a different dropout sample moves this loss by percents; same masks agree to rounding
    torch.testing.assert_close(torch.tensor(losses[2:]), torch.tensor(losses[:2]), rtol=1e-4, atol=1e-4)
    scale = max(float(p.grad.abs().max()) for p in model.parameters() if p.grad is not None)
    for (n, p), q in zip(model.named_parameters(), twin.parameters()):
        if p.grad is not None:
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-3, atol=1e-4 * scale, msg=lambda m, n=n: f"{n}: {m}")
