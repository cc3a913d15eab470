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
    # training graphs too, with their own rule (decide_training); a backward that does not replay
    # is the wrapper's boxed form (test_training_wrapper_boxes_what_it_does_not_replay)
    assert opts.fw_compiler.__name__.startswith("auto_cudagraphs(")
    assert opts.bw_compiler.__name__.startswith("auto_cudagraphs(")
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


def _train_est(launches, externs, conv_nodes=0, conv_calls=0, device_us=1000.0):
    r = auto.RULE
    host = (r.host_us_per_launch * (launches - externs) + r.host_us_per_convolution * conv_calls
            + r.host_us_per_extern * (externs - conv_nodes))
    return dict(launches=launches, externs=externs, bytes=0, flops=0, host_us=0.0, train_host_us=host,
                device_us=device_us)


def test_training_rule_replays_graphs_whose_host_time_is_near_their_device_time():
    # ember's estimates on the H100 (benchmarks/gpu_suite.py rows, 2026-11-26): launches, ATen calls,
    # device estimate in us
    resnet_fw = _train_est(337, 54, conv_nodes=53, conv_calls=53, device_us=6669)
    resnet_bw = _train_est(331, 57, conv_nodes=53, conv_calls=106, device_us=13512)
    llama_bw = _train_est(597, 363, device_us=15538)
    gpt2_fw, gpt2_bw = _train_est(212, 86, device_us=7464), _train_est(418, 112, device_us=15899)
    for est in (resnet_fw, resnet_bw, llama_bw):
        replay, why = auto.decide_training(est, None)
        assert replay and why.startswith("host time near device time"), why
    for est in (gpt2_fw, gpt2_bw):
        replay, why = auto.decide_training(est, None)
        assert not replay and why.startswith("device-bound"), why
    assert not auto.decide_training(_train_est(1, 0, device_us=0.1), None)[0]
    assert not auto.decide_training(None, "dynamic shapes (input 0 has symbolic sizes)")[0]


def test_distributed_training_is_left_alone(monkeypatch):
    monkeypatch.setattr(auto, "_distributed", lambda: True)
    replay, why = auto.decide_training(_train_est(100, 50, device_us=1.0), None)
    assert not replay and "distributed" in why


class _Compiled:
    """A compiled graph as the native backend returns it: a report, and a boxed form."""
    def __init__(self, fn, kernels, externs, nbytes):
        self.fn, self.ember_native = fn, {"report": {"kernels": kernels, "externs": externs, "bytes": nbytes}}
        self.boxed = lambda args: fn(*args)

    def __call__(self, *args):
        return self.fn(*args)


def test_estimate_counts_a_convolution_backward_as_two_cudnn_calls():
    def f(x, w, g):
        return torch.ops.aten.convolution_backward(g, x, w, [0], [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
                                                   [True, True, False])[:2]
    args = [torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3), torch.randn(2, 4, 6, 6)]
    gm = make_fx(f, tracing_mode="fake")(*args)
    r = auto.RULE
    est = auto.estimate(gm, _Compiled(gm.forward, kernels=3, externs=2, nbytes=0), 0)
    # 3 launches: one convolution backward (two cuDNN calls), one other ATen call, one Triton kernel
    assert est["launches"] == 5 and est["externs"] == 2
    assert est["train_host_us"] == 3 * r.host_us_per_launch + 2 * r.host_us_per_convolution + r.host_us_per_extern


def test_training_wrapper_boxes_what_it_does_not_replay(fake, monkeypatch):
    monkeypatch.setattr(config, "auto_cudagraphs", True)
    big = torch.randn(2048, 2048)
    gm = make_fx(lambda t: (t * 2 + 1,))(big)
    boxed = []

    def finish(fn):
        boxed.append(fn)
        return fn.boxed
    compiled = auto.wrap_auto(lambda g, ex: _Compiled(g.forward, 1, 0, 32 << 20), api=fake, training=True,
                              finish=finish)(gm, [big])
    assert not isinstance(compiled, cg.Runner) and len(boxed) == 1 and not auto.DECISIONS[-1][1]
    torch.testing.assert_close(compiled([big])[0], big * 2 + 1)

    def small(x, w):
        return ((x @ w).relu() + 1,)
    x, w = torch.randn(4, 8), torch.nn.Parameter(torch.randn(8, 8))
    gm2 = make_fx(small)(x, w)
    compiled2 = auto.wrap_auto(lambda g, ex: _Compiled(g.forward, 2, 1, 512), api=fake, training=True,
                               finish=finish)(gm2, [x, w])
    assert isinstance(compiled2, cg.Runner) and len(boxed) == 1 and auto.DECISIONS[-1][1]
    with torch.no_grad():
        for _ in range(3):
            (out,) = compiled2(x, w)
            torch.testing.assert_close(out, small(x, w)[0])
            del out


@pytest.mark.gpu
def test_small_convnet_training_replays_in_default_mode_and_matches_eager():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    import copy
    import ember
    cg.reset()
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                            torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 4)).cuda()
    ref = copy.deepcopy(m)
    opt, ref_opt = (torch.optim.SGD(p.parameters(), lr=0.1, momentum=0.9) for p in (m, ref))
    cm = ember.compile(m)
    before = len(auto.DECISIONS)
    for step in range(5):
        x = torch.randn(4, 3, 16, 16, device="cuda")
        for model, o in ((cm, opt), (ref, ref_opt)):
            loss = model(x).square().mean()
            loss.backward()
            o.step()
            o.zero_grad(set_to_none=True)
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-3, atol=1e-4)
    for b, c in zip(m.buffers(), ref.buffers()):
        torch.testing.assert_close(b.float(), c.float(), rtol=1e-3, atol=1e-4)
    decided = auto.DECISIONS[before:]
    assert [d[1] for d in decided] == [True, True], decided
    assert cg.stats()["replays"] >= 6, cg.stats()


def test_a_graph_shared_by_call_sites_never_replays(fake, monkeypatch):
    # regional compilation's shared parts: each call brings other weights, which a replay would copy
    monkeypatch.setattr(config, "auto_cudagraphs", True)

    def small(x, w):
        return ((x @ w).relu() + 1,)
    x, w = torch.randn(4, 8), torch.nn.Parameter(torch.randn(8, 8))
    gm = make_fx(small)(x, w)
    for training in (False, True):
        with auto.shared_by_call_sites():
            compiled = auto.wrap_auto(lambda g, ex: _Compiled(g.forward, 2, 1, 512), api=fake,
                                      training=training)(gm, [x, w])
        assert not isinstance(compiled, cg.Runner)
        assert not auto.DECISIONS[-1][1] and "regional" in auto.DECISIONS[-1][2]
    compiled = auto.wrap_auto(lambda g, ex: _Compiled(g.forward, 2, 1, 512), api=fake, training=True)(gm, [x, w])
    assert isinstance(compiled, cg.Runner)  # (outside the context: the rule decides again)


@pytest.mark.gpu
@pytest.mark.parametrize("attention", [False, True], ids=["dropout", "attention_dropout"])
def test_training_with_dropout_in_default_mode_draws_eager_stream(attention):
    """Dropout under automatic CUDA graphs: an MLP whose graphs replay draws the same masks as eager at
    every step (the graph advances the generator as eager does); attention dropout is never captured
    (its philox seed changes kind under capture: ember/cudagraphs/analysis.py) and still matches."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    import copy
    import ember
    import torch.nn.functional as F

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(32, 32), torch.nn.Linear(32, 8)

        def forward(self, x):
            h = F.dropout(torch.relu(self.a(x)), 0.3, training=True)
            if attention:
                q = h.view(1, 8, 2, 16).transpose(1, 2)
                h = F.scaled_dot_product_attention(q, q, q, dropout_p=0.2).transpose(1, 2).reshape(8, 32)
            return self.b(h)

    cg.reset()
    torch.manual_seed(0)
    ref = Net().cuda()
    m = copy.deepcopy(ref)
    cm = ember.compile(m)
    before = len(auto.DECISIONS)
    x = torch.randn(8, 32, device="cuda")
    for step in range(5):
        losses, states = [], []
        for model in (ref, cm):
            torch.manual_seed(100 + step)
            loss = model(x).square().mean()
            loss.backward()
            losses.append(loss.item())
            states.append(torch.cuda.get_rng_state())
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-4, atol=1e-5, msg=lambda e, s=step: f"step {s}: {e}")
        # the generator goes on from where eager's does (the warm-up run before a capture draws too)
        assert torch.equal(states[1], states[0]), f"step {step}: the generator state differs from eager's"
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-5)
    replayed = [d[1] for d in auto.DECISIONS[before:]]
    assert replayed == ([False, False] if attention else [True, True]), auto.DECISIONS[before:]


def test_stored_graph_facts_decide_as_the_graph_does():
    """``graph_facts`` (what a cached graph stores for the decision) gives ``skip_reason`` and the
    estimate the answers a scan of the graph gives, for a graph API that takes CPU tensors and one
    that refuses them, with and without a host synchronization."""
    from ember.cudagraphs import analysis
    from tests.cudagraphs.fake_cuda import FakeCuda
    from ember.cudagraphs.pool import TorchCuda

    def plain(x, w):
        return (torch.addmm(w[0], x, w).relu().sum(0),)

    def syncs(x, w):
        return ((x @ w).nonzero(),)

    def attention_dropout(x, w):
        q = (x @ w).view(1, 2, 4, 8)
        return (torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, q, q, dropout_p=0.2)[0],)
    x, w = torch.randn(8, 8), torch.randn(8, 8)
    for f in (plain, syncs, attention_dropout):
        gm = make_fx(f, tracing_mode="fake")(x, w)
        facts = auto.graph_facts(gm)
        assert facts["flops"] == auto.graph_flops(gm) and facts["aten"] == auto._aten_estimate(gm)
        for api in (FakeCuda(), TorchCuda()):
            for ex in ([x, w], []):
                assert analysis.skip_reason(None, ex, api, facts=facts["capture"]) == \
                    analysis.skip_reason(gm, ex, api), (f.__name__, api, ex)
        stored = analysis.skip_reason(None, [], FakeCuda(), facts=facts["capture"])
        if f is attention_dropout:
            assert "attention dropout" in stored, stored
        else:
            assert stored == (None if f is plain else "nonzero (nonzero) waits for a device value on the host")
