"""Whole models through backend="openvino" against eager: a ResNet-style CNN, a transformer encoder,
Hugging Face GPT-2 and BERT (small configs, built locally), a PT2E int8-quantized CNN, and training."""
import pytest

from tests.openvino.conftest import require_openvino  # noqa: E402

require_openvino()

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import ember  # noqa: E402
from tests.openvino.helpers import F32, rel_err  # noqa: E402

# Default precision: OpenVINO may run f32 models in bf16 on CPUs with bf16 units (AMX/AVX512-BF16);
# docs/openvino.md documents up to 2e-2 relative error then. On CPUs without them it is f32.
DEFAULT_PRECISION_TOL = 2e-2


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + (x if self.down is None else self.down(x)))


class TinyResNet(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        self.layers = nn.Sequential(BasicBlock(16, 16, 1), BasicBlock(16, 32, 2), BasicBlock(32, 64, 2))
        self.head = nn.Linear(64, classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def _randomize_bn(model):
    """Non-trivial batch-norm statistics, so folding them into convolutions is actually tested."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)
    return model


def _check(model, inputs, options, tol, reports=None):
    compiled = ember.compile(model, backend="openvino", options=options)
    with torch.no_grad():
        expected, got = model(*inputs), compiled(*inputs)
        again = compiled(*inputs)  # the second call runs the cached, compiled graph
    for out in (got, again):
        assert rel_err(_main(out), _main(expected)) < tol, rel_err(_main(out), _main(expected))
    return compiled


def _main(out):
    for attr in ("logits", "last_hidden_state"):
        if hasattr(out, attr):
            return getattr(out, attr)
    return out


def test_resnet_f32(reports):
    model = _randomize_bn(TinyResNet()).eval()
    _check(model, (torch.randn(2, 3, 32, 32),), F32, 1e-4)
    # the whole network is one OpenVINO partition, weights frozen into it
    [report] = reports()
    assert report["fully_converted"], report
    assert report["partitions"][0]["constants"] > 0


def test_resnet_default_precision():
    model = _randomize_bn(TinyResNet()).eval()
    _check(model, (torch.randn(1, 3, 32, 32),), None, DEFAULT_PRECISION_TOL)


def test_transformer_encoder(reports):
    layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    _check(model, (torch.randn(2, 16, 64),), F32, 1e-4)
    assert any(r["partitions"] for r in reports())


@pytest.mark.parametrize("norm_first, activation", [(False, "relu"), (True, "gelu")])
def test_encoder_fast_path_is_decomposed(norm_first, activation, reports):
    """In inference nn.TransformerEncoderLayer runs one fused op that OpenVINO cannot convert; the
    backend writes it out in ordinary ops, so the whole layer becomes one partition."""
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True, norm_first=norm_first,
                                       activation=activation).eval()
    _check(layer, (torch.randn(2, 6, 32),), F32, 1e-4)
    assert reports()[0]["fully_converted"], reports()


def test_multi_head_attention_fast_path():
    attn = nn.MultiheadAttention(32, 4, batch_first=True).eval()

    def f(q):
        return attn(q, q, q, need_weights=False)  # eager returns (output, None)

    compiled = ember.compile(f, backend="openvino", options=F32)
    x = torch.randn(2, 6, 32)
    with torch.no_grad():
        (got, got_w), (expected, expected_w) = compiled(x), f(x)
    assert got_w is None and expected_w is None
    assert rel_err(got, expected) < 1e-4


def test_transformer_encoder_default_precision():
    layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    _check(model, (torch.randn(2, 16, 64),), None, DEFAULT_PRECISION_TOL)


def test_gpt2_small(reports):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=500, n_positions=64,
                                     bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config).eval()
    _check(model, (torch.randint(0, 500, (2, 16)),), F32, 1e-4)
    assert any(r["partitions"] for r in reports())


def test_bert_small(reports):
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                     intermediate_size=128, vocab_size=500, max_position_embeddings=64)
    model = transformers.BertModel(config).eval()
    ids = torch.randint(0, 500, (2, 16))
    _check(model, (ids,), F32, 1e-4)
    assert any(r["partitions"] for r in reports())


def test_training_gradients_match_eager():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    twin = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    twin.load_state_dict(model.state_dict())
    compiled = ember.compile(twin, backend="openvino", options=F32)
    x = torch.randn(5, 8)
    model(x).square().sum().backward()
    compiled(x).square().sum().backward()
    for p, q in zip(model.parameters(), twin.parameters()):
        assert rel_err(q.grad, p.grad) < 1e-4


def test_pt2e_int8_model_runs_in_int8(reports):
    """A PT2E-quantized model (convert_pt2e(fold_quantize=False)) executes int8 convolutions/matmuls.

    ember's frontend cannot yet capture a graph that calls OpOverload objects directly (an exported
    program's module does), so the backend is called on the GraphModule directly."""
    pytest.importorskip("torchao")
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as xiq

    from ember.backends.registry import lookup_backend

    model = nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU(), nn.Conv2d(16, 32, 3), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)).eval()
    x = torch.randn(4, 3, 32, 32)
    quantizer = xiq.X86InductorQuantizer().set_global(xiq.get_default_x86_inductor_quantization_config())
    prepared = prepare_pt2e(torch.export.export(model, (x,)).module(), quantizer)
    for _ in range(4):
        prepared(torch.randn(4, 3, 32, 32))
    quantized = convert_pt2e(prepared, fold_quantize=False)
    with torch.no_grad():
        compiled = lookup_backend("openvino")(quantized, [x])
        expected, got = quantized(x), compiled(x)
    # int8 arithmetic vs PyTorch's fp32 simulation of it: they differ by about one quantization step
    assert rel_err(got[0] if isinstance(got, tuple) else got, expected) < 5e-2
    [report] = reports()
    assert report["fully_converted"]
    assert "quantized_decomposed.quantize_per_tensor.default" in report["partitions"][0]["ops"]
    graph = next(iter(compiled.variants.values())).compiled.built.module
    precisions = {}
    for part in graph.children():
        for op in part.compiled.get_runtime_model().get_ordered_ops():
            info = op.get_rt_info()
            precisions.setdefault(info["layerType"].astype(str), set()).add(info["runtimePrecision"].astype(str))
    assert precisions["Convolution"] <= {"u8", "i8"}, precisions
    assert precisions["FullyConnected"] <= {"u8", "i8"}, precisions
