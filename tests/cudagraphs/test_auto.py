"""Default mode's automatic CUDA graphs (ember/cudagraphs/auto.py): the rule on its own, the FLOP
count read from a graph, and the compiler wrapper on CPU tensors with the fake graph API. On a GPU,
benchmarks/gpu_suite.py's tiny_hf row shows the decision's effect (h28_gpu_check.sh)."""
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import ember.cudagraphs as cg
from ember.config import config
from ember.cudagraphs import auto


def _est(launches, nbytes=0, flops=0):
    r = auto.RULE
    return dict(launches=launches, bytes=nbytes, flops=flops, host_us=r.host_us_per_launch * launches,
                device_us=nbytes / r.bytes_per_us + flops / r.flops_per_us)


def test_host_bound_graph_replays():
    replay, why = auto.decide(_est(30, nbytes=200_000, flops=5_000_000), None)
    assert replay and why.startswith("host-bound")


def test_device_bound_graph_runs_as_compiled():
    # GPT-2 inference b8x512: ~1.1 TFLOP over ~100 launches
    replay, why = auto.decide(_est(100, nbytes=60 << 20, flops=int(1.1e12)), None)
    assert not replay and why.startswith("device-bound")


def test_one_launch_gains_nothing():
    replay, why = auto.decide(_est(1, nbytes=64), None)
    assert not replay and "nothing to save" in why


def test_large_memory_stays_out_even_when_few_flops():
    replay, why = auto.decide(_est(10_000, nbytes=auto.RULE.max_bytes + 1), None)
    assert not replay and "bytes" in why


def test_a_graph_that_cannot_be_captured_is_never_replayed():
    replay, why = auto.decide(_est(30, nbytes=100), "item (x) waits for a device value on the host")
    assert not replay and why.startswith("cannot be captured")


def test_threshold_is_device_time_against_host_time():
    r = auto.RULE
    n = 4  # (under max_bytes at the threshold)
    at = int(n * r.host_us_per_launch * r.bytes_per_us)  # bytes whose device time equals the host time
    assert auto.decide(_est(n, nbytes=at), None)[0]
    assert not auto.decide(_est(n, nbytes=at + int(r.bytes_per_us)), None)[0]


def test_graph_flops_counts_matmuls_from_shapes():
    def f(x, w, b, w2):
        return torch.addmm(b, x, w).relu() @ w2
    args = [torch.randn(8, 16), torch.randn(16, 32), torch.randn(32), torch.randn(32, 4)]
    gm = make_fx(f, tracing_mode="fake")(*args)
    assert auto.graph_flops(gm) == 2 * 8 * 16 * 32 + 2 * 8 * 32 * 4


def test_aten_estimate_skips_views():
    def f(x):
        return (x.view(4, 4) * 2).t().sum()
    gm = make_fx(f, tracing_mode="fake")(torch.randn(16))
    est = auto.estimate(gm, gm.forward, 0)
    assert est["launches"] == 2  # mul and sum; view and t are free


def test_wrapper_replays_a_small_graph_and_leaves_a_large_one(fake, monkeypatch):
    monkeypatch.setattr(config, "auto_cudagraphs", True)

    def small(x, w):
        return ((x @ w).relu() + 1,)
    x, w = torch.randn(4, 8), torch.nn.Parameter(torch.randn(8, 8))
    gm = make_fx(small)(x, w)
    compiled = auto.wrap_auto(lambda g, ex: g.forward, api=fake)(gm, [x, w])
    assert isinstance(compiled, cg.Runner)
    with torch.no_grad():
        for _ in range(4):
            (out,) = compiled(x, w)
            torch.testing.assert_close(out, small(x, w)[0])
            del out
    assert fake.captures == 1 and cg.stats()["replays"] >= 1
    name, replay, why = auto.DECISIONS[-1]
    assert replay and "host-bound" in why

    big = torch.randn(4096, 4096)  # 64 MiB read and written: device-bound
    gm2 = make_fx(lambda t: (t * 2 + 1,))(big)
    compiled2 = auto.wrap_auto(lambda g, ex: g.forward, api=fake)(gm2, [big])
    assert not isinstance(compiled2, cg.Runner) and not auto.DECISIONS[-1][1]


def test_config_turns_the_choice_off(fake, monkeypatch):
    monkeypatch.setattr(config, "auto_cudagraphs", False)
    x = torch.randn(4, 8)
    gm = make_fx(lambda x: ((x * 2).relu() + 1,))(x)
    before = len(auto.DECISIONS)
    compiled = auto.wrap_auto(lambda g, ex: g.forward, api=fake)(gm, [x])
    assert not isinstance(compiled, cg.Runner) and len(auto.DECISIONS) == before


def test_default_mode_inference_compiler_is_the_auto_one():
    from ember.backends.ember_backend import _native_backend
    opts = _native_backend(False, False, ()).options
    assert opts.inference_compiler.__name__.startswith("auto_cudagraphs(")
    assert not opts.fw_compiler.__name__.startswith("auto") and opts.bw_compiler.__name__.startswith("boxed(")
    ro = _native_backend(True, False, ()).options  # reduce-overhead: every graph, as before
    assert ro.inference_compiler is ro.fw_compiler


@pytest.mark.gpu
def test_tiny_model_replays_in_default_mode_on_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    import ember
    cg.reset()
    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.LayerNorm(64),
                            torch.nn.Linear(64, 64)).cuda().eval()
    x = torch.randn(2, 64, device="cuda")
    cm = ember.compile(m)
    with torch.no_grad():
        ref = m(x)
        for _ in range(5):
            out = cm(x)
            torch.testing.assert_close(out, ref, rtol=1e-3, atol=1e-3)
            del out
    assert cg.stats()["replays"] >= 1, auto.DECISIONS
