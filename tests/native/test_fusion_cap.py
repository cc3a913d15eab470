"""The fusion cap (NativeOptions.max_fused_buffers, ember.config.native_max_fused_buffers): no fused
kernel reads and writes more distinct buffers than the cap, which splits what a deep model fuses
across its layers (a 24-layer Llama's forward fused its 24 rotary-embedded key outputs into one
kernel of 49 buffers, its backward recomputed the residual stream in one of 151: each took seconds
of Triton build, the critical path of a cold compile). Outputs match eager either way."""
import pytest
import torch

from ember.native.backend import DEFAULT_OPTIONS, plan
from ember.native.options import resolve
from tests.native.harness import DEVICE, run_case, trace

K, R, D = 20, 8, 16


def siblings(x, *ws):
    """K outputs that share one input (horizontal fusion): 1 + 2K buffers in one kernel."""
    return [torch.sin(x) * w + 1.0 for w in ws]


def stream(x, *bs):
    """A residual stream whose every partial sum is an output (vertical chain): 1 + 2K buffers."""
    outs, h = [], x
    for b in bs:
        h = h + b
        outs.append(h * 2.0)
    return outs


def _inputs():
    torch.manual_seed(0)
    return [torch.randn(R, D, device=DEVICE) for _ in range(K + 1)]


def _buffers_per_kernel(fn, inputs, cap):
    g, _, sched, _ = plan(trace(fn, inputs), inputs, dict(DEFAULT_OPTIONS, max_fused_buffers=cap))
    return [len(k.reads) + len(k.writes) for k in sched.steps if hasattr(k, "reads")]


@pytest.mark.parametrize("fn", [siblings, stream], ids=["siblings", "stream"])
def test_no_kernel_past_the_cap(fn):
    inputs = _inputs()
    uncapped = _buffers_per_kernel(fn, inputs, 0)
    assert uncapped == [1 + 2 * K], uncapped  # (without the cap: one kernel; the check below can fail)
    for cap in (32, 8):
        sizes = _buffers_per_kernel(fn, inputs, cap)
        assert max(sizes) <= cap, (cap, sizes)
        assert len(sizes) <= -(-(1 + 2 * K) // (cap - 3)) + 1, (cap, sizes)  # split, not shattered


@pytest.mark.parametrize("fn", [siblings, stream], ids=["siblings", "stream"])
@pytest.mark.parametrize("cap", [0, 8])
def test_outputs_match_eager(fn, cap, native_cache):
    compiled = run_case(fn, _inputs(), options={"max_fused_buffers": cap}, cache_dir=native_cache)
    assert compiled.ember_native["report"]["kernels"] == (1 if cap == 0 else
                                                          len(_buffers_per_kernel(fn, _inputs(), cap)))


def test_default_and_config(monkeypatch):
    import ember
    assert resolve().max_fused_buffers == 32 == ember.config.native_max_fused_buffers
    monkeypatch.setattr(ember.config, "native_max_fused_buffers", 0)
    assert resolve().max_fused_buffers == 0  # (the A/B switch: EMBER_NATIVE_MAX_FUSED_BUFFERS=0)
    assert resolve({"max_fused_buffers": 12}).max_fused_buffers == 12
    with pytest.raises(ValueError, match="max_fused_buffers"):
        resolve({"max_fused_buffers": -1})
