"""Hugging Face models through graph breaks: greedy generate() of GPT-2 (a Python loop around the
model) and a model with data-dependent control flow, each identical to eager.

Tiny configs with random weights; nothing is downloaded. Graph and break counts come from
ember.explain and are printed (pytest -s) for the record.
"""
import pytest
import torch

import ember
from ember.testing import CompileCounter

transformers = pytest.importorskip("transformers")
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402
from transformers.models.gpt2.modeling_gpt2 import GPT2Block  # noqa: E402


def _gpt2():
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=64, bos_token_id=1,
                     eos_token_id=2)
    return GPT2LMHeadModel(cfg).eval(), cfg


def test_gpt2_greedy_generate_with_compiled_forward():
    model, cfg = _gpt2()
    ids = torch.randint(3, 100, (2, 5))
    with torch.no_grad():
        expected = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
    twin = GPT2LMHeadModel(cfg).eval()
    twin.load_state_dict(model.state_dict())
    cnt = CompileCounter()
    twin.forward = ember.compile(twin.forward, backend=cnt)
    with torch.no_grad():
        actual = twin.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(actual, expected)
    assert cnt.frame_count >= 1


def test_gpt2_greedy_generate_compiled_whole():
    """ember.compile(model.generate): the Python loop, config handling and logits processors break
    into many graphs; the tokens must still be exactly eager's."""
    model, _ = _gpt2()
    ids = torch.randint(3, 100, (2, 5))
    with torch.no_grad():
        expected = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # parts that cannot resume run eagerly, with a warning each
        report = ember.explain(model.generate)(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(report.out, expected)
    assert report.graph_count >= 1 and report.graph_break_count >= 1
    print(f"\nGPT-2 generate: {report.graph_count} graphs, {report.graph_break_count} breaks, "
          f"{len(report.fallbacks)} callables run eagerly")


class EarlyExitGPT2(torch.nn.Module):
    """GPT-2 blocks with a data-dependent early exit and a value-dependent log line."""

    def __init__(self, cfg, threshold):
        super().__init__()
        self.blocks = torch.nn.ModuleList(GPT2Block(cfg, layer_idx=i) for i in range(cfg.n_layer))
        self.threshold = threshold
        self.used = 0

    def forward(self, h):
        for block in self.blocks:
            h = block(h)[0] if isinstance(block(h), tuple) else block(h)
            if h.abs().mean() > self.threshold:  # decided by the data
                break
        self.used = int(h.norm() > 0)
        if h.sum().item() > 0:
            return h * 2, "positive"
        return h - 1, "negative"


@pytest.mark.parametrize("threshold", [0.0, 1e9])
def test_data_dependent_control_flow_model(threshold):
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=3, n_embd=32, n_head=4)
    model = EarlyExitGPT2(cfg, threshold).eval()
    twin = EarlyExitGPT2(cfg, threshold).eval()
    twin.load_state_dict(model.state_dict())
    cnt = CompileCounter()
    compiled = ember.compile(twin, backend=cnt)
    for seed in (1, 2):
        h = torch.randn(2, 4, 32, generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            e = model(h)
            a = compiled(h)
        torch.testing.assert_close(a[0], e[0])
        assert a[1] == e[1] and twin.used == model.used
    assert cnt.frame_count >= 2
    report = ember.explain(EarlyExitGPT2(cfg, threshold).eval())(h)
    print(f"\nearly-exit GPT-2 (threshold={threshold}): {report.graph_count} graphs, "
          f"{report.graph_break_count} breaks")


# ---- zoo models whose constructs used to break (issue 8) -------------------------------------------
# t5: copy.deepcopy of its config and a cache object made in forward; bloom: an autograd.Function;
# codegen: nn.Softmax made in forward; deberta-v2: torch.jit.script helpers; wav2vec2: an lru_cache'd
# probe; speech2text: a KeyError caught by Mapping.get
@pytest.mark.parametrize("name", ["t5", "bloom", "codegen", "deberta-v2", "wav2vec2", "speech2text"])
def test_zoo_model_without_graph_breaks(name):
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
    import zoo_models

    model, inputs = zoo_models.build(zoo_models.MODELS[name], "cpu", torch.float32)
    args, kwargs = inputs(0)
    with torch.no_grad():
        expected = model(*args, **kwargs)
        report = ember.explain(model)(*args, **kwargs)
    assert report.graph_break_count == 0 and not report.fallbacks, report.break_reasons or report.fallbacks
    got = {k: v for k, v in report.out.items() if isinstance(v, torch.Tensor)}
    want = {k: v for k, v in expected.items() if isinstance(v, torch.Tensor)}
    assert got.keys() == want.keys() and got
    for k in want:
        torch.testing.assert_close(got[k], want[k])
