"""Whole real models captured in one graph: HF GPT-2 / BERT / Llama (tiny configs, random weights) and a ResNet-style CNN.

Each test compares eager against `ember.compile(model, backend=cnt, fullgraph=True)`: same output structure (same
ModelOutput class, same keys, a DynamicCache with the same layers), close tensors, exactly one graph, and no recompile
on a second call with fresh inputs of the same shape. The models are tiny so the file runs in seconds on CPU; nothing
is downloaded. See docs/notes/hf-models-survey.md for what these forwards need from the frontend.
"""
import pytest
import torch
from torch import nn

import ember
import ember.testing

TOL = dict(rtol=1.3e-6, atol=1e-5)  # fp32 defaults: the graph runs the same ATen ops as eager
BATCH, SEQ, VOCAB = 2, 8, 100


# ---------------------------------------------------------------------------------------------------------- helpers

def assert_same_structure(expected, actual, path="out"):
    """Recursively compare an eager result with a compiled one: same types, same keys, close tensors."""
    assert type(actual) is type(expected), f"{path}: {type(actual).__name__} != {type(expected).__name__}"
    if isinstance(expected, torch.Tensor):
        assert actual.shape == expected.shape, f"{path}: shape {actual.shape} != {expected.shape}"
        assert actual.dtype == expected.dtype, f"{path}: dtype {actual.dtype} != {expected.dtype}"
        assert actual.requires_grad == expected.requires_grad, f"{path}: requires_grad differs"
        torch.testing.assert_close(actual.detach(), expected.detach(), **TOL, msg=lambda m: f"{path}: {m}")
    elif isinstance(expected, dict):  # ModelOutput is an OrderedDict subclass: keys hold the non-None fields
        assert list(actual.keys()) == list(expected.keys()), f"{path}: keys {list(actual.keys())} != {list(expected.keys())}"
        for key in expected.keys():
            assert_same_structure(expected[key], actual[key], f"{path}[{key!r}]")
    elif isinstance(expected, (tuple, list)):
        assert len(actual) == len(expected), f"{path}: length {len(actual)} != {len(expected)}"
        for i, (e, a) in enumerate(zip(expected, actual)):
            assert_same_structure(e, a, f"{path}[{i}]")
    elif hasattr(expected, "layers") and hasattr(expected, "get_seq_length"):  # a transformers Cache
        assert len(actual.layers) == len(expected.layers), f"{path}: {len(actual.layers)} cache layers"
        assert actual.get_seq_length() == expected.get_seq_length(), f"{path}: cache seq length differs"
        for i, (e, a) in enumerate(zip(expected.layers, actual.layers)):
            assert type(a) is type(e), f"{path}.layers[{i}]: {type(a).__name__} != {type(e).__name__}"
            assert a.is_initialized == e.is_initialized, f"{path}.layers[{i}].is_initialized differs"
            assert_same_structure(e.keys, a.keys, f"{path}.layers[{i}].keys")
            assert_same_structure(e.values, a.values, f"{path}.layers[{i}].values")
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def check_one_graph_no_recompile(model, make_inputs):
    """Eager vs compiled on two different inputs of the same shape; one graph, one compile."""
    cnt = ember.testing.CompileCounter()
    compiled = ember.compile(model, backend=cnt, fullgraph=True)

    args, kwargs = make_inputs()
    expected = model(*args, **kwargs)
    actual = compiled(*args, **kwargs)
    assert_same_structure(expected, actual)
    assert cnt.frame_count == 1, f"expected one graph, got {cnt.frame_count}"
    assert cnt.op_count > 0

    args, kwargs = make_inputs()  # new values, same shapes/dtypes: the guards must pass
    expected = model(*args, **kwargs)
    actual = compiled(*args, **kwargs)
    assert_same_structure(expected, actual)
    assert cnt.frame_count == 1, f"second call recompiled: {ember.testing.cache_of(compiled).recompile_reasons}"
    assert ember.testing.cache_of(compiled).compile_count == 1
    return actual


def token_inputs(**extra):
    def make():
        return (torch.randint(0, VOCAB, (BATCH, SEQ)),), dict(extra)
    return make


def padded_mask():
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, SEQ - 3:] = 0  # right padding on the second sequence: the mask really changes the result
    return mask


# ---------------------------------------------------------------------------------------------------- HF transformers

def gpt2_lm_head():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=64,
                                     bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config).eval()


def bert_config():
    transformers = pytest.importorskip("transformers")
    return transformers.BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                   intermediate_size=128, max_position_embeddings=64, num_labels=3)


def llama_causal_lm():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=128, vocab_size=VOCAB,
                                      max_position_embeddings=64)
    return transformers.LlamaForCausalLM(config).eval()


@torch.no_grad()
def test_gpt2_lm_head():
    out = check_one_graph_no_recompile(gpt2_lm_head(), token_inputs())
    assert type(out).__name__ == "CausalLMOutputWithCrossAttentions"
    assert list(out.keys()) == ["logits", "past_key_values"]  # use_cache defaults to True: a DynamicCache comes back
    assert out.logits.shape == (BATCH, SEQ, VOCAB)


@torch.no_grad()
def test_gpt2_lm_head_no_cache_tuple_output():
    out = check_one_graph_no_recompile(gpt2_lm_head(), token_inputs(use_cache=False, return_dict=False))
    assert type(out) is tuple and len(out) == 1  # to_tuple() drops the None fields


def test_gpt2_lm_head_grad_enabled():
    # Outside no_grad: parameters require grad, so the logits do too (the autograd path must keep that).
    out = check_one_graph_no_recompile(gpt2_lm_head(), token_inputs(use_cache=False))
    assert out.logits.requires_grad


@torch.no_grad()
def test_bert_with_attention_mask():
    transformers = pytest.importorskip("transformers")
    model = transformers.BertModel(bert_config()).eval()

    def make():
        return (torch.randint(0, VOCAB, (BATCH, SEQ)),), {"attention_mask": padded_mask()}

    out = check_one_graph_no_recompile(model, make)
    assert type(out).__name__ == "BaseModelOutputWithPoolingAndCrossAttentions"
    assert list(out.keys()) == ["last_hidden_state", "pooler_output"]


@torch.no_grad()
def test_bert_for_sequence_classification():
    transformers = pytest.importorskip("transformers")
    model = transformers.BertForSequenceClassification(bert_config()).eval()

    def make():
        return (torch.randint(0, VOCAB, (BATCH, SEQ)),), {"attention_mask": padded_mask()}

    out = check_one_graph_no_recompile(model, make)
    assert type(out).__name__ == "SequenceClassifierOutput"
    assert list(out.keys()) == ["logits"]
    assert out.logits.shape == (BATCH, 3)


@torch.no_grad()
def test_llama_causal_lm():
    out = check_one_graph_no_recompile(llama_causal_lm(), token_inputs())
    assert type(out).__name__ == "CausalLMOutputWithPast"
    assert list(out.keys()) == ["logits", "past_key_values"]
    assert out.logits.shape == (BATCH, SEQ, VOCAB)
    assert out.past_key_values.layers[0].keys.shape == (BATCH, 2, SEQ, 16)  # 2 kv heads, head_dim 64 / 4


@torch.no_grad()
def test_llama_causal_lm_no_cache():
    out = check_one_graph_no_recompile(llama_causal_lm(), token_inputs(use_cache=False))
    assert list(out.keys()) == ["logits"]


# ------------------------------------------------------------------------------------------------- ResNet-style CNN

class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


class TinyResNet(nn.Module):
    def __init__(self, num_classes=10, widths=(8, 16, 32)):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, padding=1, bias=False), nn.BatchNorm2d(widths[0]),
                                  nn.ReLU(inplace=True))
        blocks, cin = [], widths[0]
        for i, w in enumerate(widths):
            blocks += [BasicBlock(cin, w, stride=1 if i == 0 else 2), BasicBlock(w, w)]
            cin = w
        self.layers = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        x = torch.flatten(self.pool(x), 1)
        return self.fc(x)


def tiny_resnet():
    model = TinyResNet()
    for m in model.modules():  # non-trivial running stats, so eval-mode BatchNorm is not an identity
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)
            nn.init.uniform_(m.weight, 0.5, 1.5)
            nn.init.uniform_(m.bias, -0.2, 0.2)
    return model.eval()


@torch.no_grad()
def test_resnet_style_cnn():
    def make():
        return (torch.randn(2, 3, 16, 16),), {}

    out = check_one_graph_no_recompile(tiny_resnet(), make)
    assert out.shape == (2, 10)


def test_resnet_style_cnn_grad_enabled():
    def make():
        return (torch.randn(2, 3, 16, 16),), {}

    out = check_one_graph_no_recompile(tiny_resnet(), make)
    assert out.requires_grad
