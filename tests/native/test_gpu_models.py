"""Real models through ember's default backend (autograd layer + native Triton kernels) on CUDA:
inference in fp32 and bf16 and one training step, against eager. GPU only."""
import pytest
import torch

import ember

pytestmark = pytest.mark.gpu

TOL = {torch.float32: dict(rtol=2e-3, atol=2e-3), torch.bfloat16: dict(rtol=5e-2, atol=5e-2)}


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    # dropout off here: these tests compare kernels; tests/aot/test_aot_gpu_dropout.py checks dropout streams
    m = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64,
                                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    return m, lambda: (torch.randint(0, 128, (2, 16), device="cuda"),), lambda out: out.logits


def _bert():
    from transformers import BertConfig, BertModel

    m = BertModel(BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                             vocab_size=128, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    return m, lambda: (torch.randint(0, 128, (2, 16), device="cuda"),), lambda out: out.last_hidden_state


def _resnet():
    tv = pytest.importorskip("torchvision")
    return tv.models.resnet18(num_classes=10), lambda: (torch.randn(2, 3, 64, 64, device="cuda"),), lambda o: o


def _vit():
    tv = pytest.importorskip("torchvision")
    m = tv.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=64,
                                    mlp_dim=128, num_classes=10)
    return m, lambda: (torch.randn(2, 3, 32, 32, device="cuda"),), lambda o: o


MODELS = {"gpt2": _gpt2, "bert": _bert, "resnet18": _resnet, "vit": _vit}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", list(MODELS))
def test_inference_matches_eager(name, dtype):
    torch.manual_seed(0)
    model, inputs, pick = MODELS[name]()
    model = model.cuda().to(dtype).eval()
    compiled = ember.compile(model)
    args = tuple(a.to(dtype) if a.is_floating_point() else a for a in inputs())
    with torch.no_grad():
        expected = pick(model(*args)).float()
        actual = pick(compiled(*args)).float()
    torch.testing.assert_close(actual, expected, **TOL[dtype])


@pytest.fixture
def no_tf32():
    # cuDNN/cuBLAS may pick TF32 algorithms differently for eager and compiled graphs (conv layouts):
    # compare gradients in full fp32 (with TF32 on, resnet18's conv grads differ by ~1% of their max)
    old = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = old


@pytest.mark.parametrize("name", list(MODELS))
def test_training_step_matches_eager(name, no_tf32):
    torch.manual_seed(0)
    model, inputs, pick = MODELS[name]()
    model = model.cuda().train()
    if name in ("resnet18",):
        model.eval()  # BatchNorm batch statistics at batch 2 are noisy; the eval path is compared
    import copy

    twin = copy.deepcopy(model)
    compiled = ember.compile(twin)
    args = inputs()
    # a random projection of the output: pow(2).mean() of a LayerNorm output (BERT) is ~1 whatever
    # the weights, so its gradients would be rounding noise
    torch.manual_seed(1)
    out_e = pick(model(*args)).float()
    proj = torch.randn(out_e.shape, generator=torch.Generator().manual_seed(2)).to(out_e.device)
    loss_e = (out_e * proj).sum()
    loss_e.backward()
    torch.manual_seed(1)
    loss_c = (pick(compiled(*args)).float() * proj).sum()
    loss_c.backward()
    torch.testing.assert_close(loss_c, loss_e, rtol=2e-3, atol=2e-3)
    # some gradients are mathematically zero (attention key biases): judge every one against the
    # model's largest gradient, so rounding noise around zero is not mistaken for a difference
    scale = max(float(p.grad.abs().max()) for p in model.parameters() if p.grad is not None)
    for (n, p), q in zip(model.named_parameters(), twin.parameters()):
        if p.grad is not None:
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-3, atol=1e-4 * scale, msg=lambda m, n=n: f"{n}: {m}")
