"""The measured decision of default mode's automatic CUDA graphs (ember/cudagraphs/measure.py): an
inference graph the estimate calls device-bound is timed on its first calls and replays from then on
if its host time reaches ``Rule.measured_host_fraction`` of its device time. Host and device clocks
are injected (the fake graph API's device clock, a fake ``perf_counter``), so every decision here is
the one those timings must give; nothing is timed for real."""
import dataclasses

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import ember.cudagraphs as cg
from ember.config import config
from ember.cudagraphs import auto, measure
from tests.cudagraphs.fake_cuda import FakeCuda

N = auto.RULE.measure_calls


def _est(launches=40, nbytes=auto.RULE.max_bytes + 1, pool=1 << 20, limit=auto.RULE.max_pool_bytes):
    return dict(launches=launches, externs=0, bytes=nbytes, flops=0, pool_bytes=pool, pool_limit=limit,
                host_us=5.0 * launches, device_us=nbytes / auto.RULE.bytes_per_us)


# -- the decision on its own ----------------------------------------------------------------------

def test_measured_host_bound_graph_replays():
    # BERT-base inference on the H100 host: 3976 us of host time per call, 1724 us on the device
    replay, why = auto.decide_measured(_est(), None, [(4100.0, 1800.0), (3976.0, 1724.0), (3990.0, 1750.0)])
    assert replay and why.startswith("measured host-bound") and "host 3976 us, device 1724 us" in why


def test_measured_device_bound_graph_does_not_replay():
    replay, why = auto.decide_measured(_est(), None, [(900.0, 10_000.0), (950.0, 9_800.0)])
    assert not replay and why.startswith("measured device-bound")


def test_measured_threshold_is_the_rule_fraction():
    frac = auto.RULE.measured_host_fraction
    assert auto.decide_measured(_est(), None, [(frac * 1000.0, 1000.0)])[0]
    assert not auto.decide_measured(_est(), None, [(frac * 1000.0 - 1.0, 1000.0)])[0]


def test_least_of_each_figure_counts():
    # a preempted host call (5000 us) does not make a device-bound graph look host-bound
    assert not auto.decide_measured(_est(), None, [(5000.0, 2000.0), (500.0, 2000.0)])[0]


def test_measured_graph_over_the_memory_limit_does_not_replay():
    replay, why = auto.decide_measured(_est(pool=5 << 30, limit=4 << 30), None, [(4000.0, 1700.0)])
    assert not replay and "pool" in why


def test_measured_graph_that_cannot_be_captured_does_not_replay():
    replay, why = auto.decide_measured(_est(), "item (x) waits for a device value on the host", [(4000.0, 1.0)])
    assert not replay and why.startswith("cannot be captured")


def test_what_is_measured():
    assert auto.measurable(_est(), None)  # moves more than max_bytes: measured, not rejected
    small = _est(launches=40, nbytes=1000)
    small["device_us"] = 1e6  # device-bound by the estimate
    assert auto.measurable(small, None)
    assert not auto.measurable(_est(pool=5 << 30, limit=4 << 30), None)  # the memory limit is final
    assert not auto.measurable(_est(launches=1), None)
    assert not auto.measurable(None, "dynamic shapes (input 0 has symbolic sizes)")
    assert not auto.measurable(_est(), None, dataclasses.replace(auto.RULE, measure_calls=0))
    host_bound = _est(nbytes=1000)
    assert auto.decide(host_bound, None)[0] and not auto.measurable(host_bound, None)  # the fast path


def test_pool_limit_is_a_fraction_of_device_memory_at_most():
    fake = FakeCuda()
    fake.total = 8 << 30
    assert auto.pool_limit(fake, "cpu") == int(auto.RULE.max_pool_fraction * (8 << 30))
    fake.total = 1 << 40
    assert auto.pool_limit(fake, "cpu") == auto.RULE.max_pool_bytes
    assert auto.pool_limit(object(), "cpu") == auto.RULE.max_pool_bytes  # (an API that does not tell)


def test_pool_bytes_is_the_peak_of_live_values_not_the_bytes_moved():
    def chain(x):
        for _ in range(10):
            x = (x * 2).view(-1).view(64, 64) + 1
        return (x,)
    x = torch.randn(64, 64)
    gm = make_fx(chain, tracing_mode="fake")(x)
    size = 64 * 64 * 4
    # at most two values alive at once (each op's input and output); the views cost nothing
    assert auto.pool_bytes(gm) == 2 * size
    launches, moved = auto._aten_estimate(gm)
    assert moved == 20 * 2 * size and launches == 20

    def keeps(x):
        a = x * 2
        b = a + 1
        return (a * b, a)  # a is an output: alive to the end
    gm = make_fx(keeps, tracing_mode="fake")(x)
    assert auto.pool_bytes(gm) == 3 * size
    assert auto.graph_facts(gm)["pool"] == 3 * size


# -- the wrapper: measuring, then switching -------------------------------------------------------

class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def _compiler(fake, clock, host_us, device_us, report, calls):
    """A native-like compiler whose compiled function costs ``host_us`` of (fake) host time and
    ``device_us`` of (fake) device time per call."""
    def compiler(gm, example_inputs):
        def run(*args):
            calls.append(1)
            clock.t += host_us * 1e-6
            fake.device_clock += device_us
            return gm(*args)
        run.ember_native = {"report": dict(report)}
        return run
    return compiler


def _small(x, w):
    return ((x @ w).relu() + 1,)


@pytest.fixture
def timed(fake, monkeypatch):
    monkeypatch.setattr(config, "auto_cudagraphs", True)
    clock = Clock()
    monkeypatch.setattr(measure, "_now", clock)
    return fake, clock


BIG = dict(kernels=40, externs=0, bytes=auto.RULE.max_bytes + 1)  # device-bound by the estimate


def test_host_bound_graph_switches_to_replay_after_the_measuring_window(timed):
    fake, clock = timed
    x, w = torch.randn(4, 8), torch.nn.Parameter(torch.randn(8, 8))
    gm = make_fx(_small)(x, w)
    calls = []
    compiled = auto.wrap_auto(_compiler(fake, clock, 4000.0, 1700.0, BIG, calls), api=fake)(gm, [x, w])
    assert isinstance(compiled, measure.Measured) and not isinstance(compiled, cg.Runner)
    name, replay, why = auto.DECISIONS[-1]
    assert not replay and "deciding by timing" in why
    outs = []
    with torch.no_grad():
        for k in range(2 + N + 4):
            xi = torch.randn(4, 8)
            (out,) = compiled(xi, w)
            torch.testing.assert_close(out, _small(xi, w)[0])
            if k == 2 + N + 2:
                outs.append((out, out.clone()))  # held across the next (replayed) call
            del out
    assert fake.syncs == 1  # once, before the first timed call
    assert compiled.decision[0] and auto.DECISIONS[-1][0] == name
    assert auto.DECISIONS[-1][1] and auto.DECISIONS[-1][2].startswith("measured host-bound: host 4000 us, device 1700 us")
    # call 1 untimed, N timed, then the deciding call hands over to the runner: its warm-up, its
    # recording, then replays (a held output is copied out, never overwritten)
    s = cg.stats()
    assert s["warmups"] == 1 and s["recordings"] == 1 and s["replays"] >= 1 and fake.captures == 1
    held, value = outs[0]
    torch.testing.assert_close(held, value)
    info = compiled.ember_native["auto_cudagraphs"]
    assert info["replay"] and len(info["measured_us"]) == N


def test_device_bound_graph_keeps_running_as_compiled(timed):
    fake, clock = timed
    x, w = torch.randn(4, 8), torch.nn.Parameter(torch.randn(8, 8))
    gm = make_fx(_small)(x, w)
    calls = []
    compiled = auto.wrap_auto(_compiler(fake, clock, 500.0, 10_000.0, BIG, calls), api=fake)(gm, [x, w])
    with torch.no_grad():
        for _ in range(2 + N + 5):
            xi = torch.randn(4, 8)
            torch.testing.assert_close(compiled(xi, w)[0], _small(xi, w)[0])
    assert compiled.decision[0] is False and compiled.runner is None
    assert auto.DECISIONS[-1][2].startswith("measured device-bound")
    assert fake.captures == 0 and cg.stats()["warmups"] == 0 and len(calls) == 2 + N + 5


def test_events_not_done_wait_then_synchronize_once(timed, monkeypatch):
    fake, clock = timed
    monkeypatch.setattr(auto, "RULE", dataclasses.replace(auto.RULE, measure_wait_calls=3))
    fake.events_done = False
    x, w = torch.randn(4, 8), torch.nn.Parameter(torch.randn(8, 8))
    compiled = auto.wrap_auto(_compiler(fake, clock, 4000.0, 1700.0, BIG, []), api=fake)(make_fx(_small)(x, w), [x, w])
    with torch.no_grad():
        for _ in range(1 + N + 2):  # the events are not done: no decision, no synchronize yet
            compiled(x, w)
        assert compiled.decision is None and fake.syncs == 1
        compiled(x, w)  # the third call past the window synchronizes the last event and decides
    assert compiled.decision[0]


def test_calls_inside_a_capture_are_not_timed(timed):
    fake, clock = timed
    x, w = torch.randn(4, 8), torch.nn.Parameter(torch.randn(8, 8))
    compiled = auto.wrap_auto(_compiler(fake, clock, 4000.0, 1700.0, BIG, []), api=fake)(make_fx(_small)(x, w), [x, w])
    fake.capturing_now = True
    with torch.no_grad():
        for _ in range(2 + N + 2):
            compiled(x, w)
    assert compiled.decision is None and compiled.timed == [] and not getattr(fake, "syncs", 0)


def test_a_graph_whose_pool_is_over_the_limit_is_not_measured(timed):
    fake, clock = timed
    fake.total = 1000  # a device of 1000 bytes: a tenth of it is less than the graph's pool
    x, w = torch.randn(4, 8), torch.nn.Parameter(torch.randn(8, 8))
    compiled = auto.wrap_auto(_compiler(fake, clock, 4000.0, 1700.0, BIG, []), api=fake)(make_fx(_small)(x, w), [x, w])
    assert not isinstance(compiled, (measure.Measured, cg.Runner))
    assert not auto.DECISIONS[-1][1] and "pool" in auto.DECISIONS[-1][2]


def test_a_graph_that_cannot_be_captured_is_not_measured(timed):
    fake, clock = timed

    def syncs(x, w):
        return (((x @ w) > 0).nonzero(), x * 2)
    x, w = torch.randn(4, 8), torch.nn.Parameter(torch.randn(8, 8))
    gm = make_fx(syncs)(x, w)
    compiled = auto.wrap_auto(_compiler(fake, clock, 4000.0, 1700.0, BIG, []), api=fake)(gm, [x, w])
    assert not isinstance(compiled, (measure.Measured, cg.Runner))
    assert auto.DECISIONS[-1][2].startswith("cannot be captured")


def test_a_boxed_compiled_function_is_called_boxed_throughout(timed):
    fake, clock = timed
    x, w = torch.randn(4, 8), torch.nn.Parameter(torch.randn(8, 8))

    def compiler(gm, example_inputs):
        def run(args):
            a = list(args)
            args.clear()
            clock.t += 4000e-6
            fake.device_clock += 1700.0
            return gm(*a)
        run._boxed_call = True
        run.ember_native = {"report": dict(BIG)}
        return run
    compiled = auto.wrap_auto(compiler, api=fake)(make_fx(_small)(x, w), [x, w])
    assert compiled._boxed_call
    with torch.no_grad():
        for _ in range(2 + N + 4):
            box = [x, w]
            out = compiled(box)
            assert box == []  # (the boxed convention: the callee empties the list)
            torch.testing.assert_close(out[0], _small(x, w)[0])
            del out
    assert compiled.decision[0] and cg.stats()["replays"] >= 1


def test_a_warm_process_measures_and_decides_as_the_compiling_one(timed):
    """A graph loaded from the aot cache (nodes not built; the facts stored with it) is measured by
    the same rule and reaches the decision the compiling process reached, for either timing."""
    from ember.aot import cache as aot_cache
    from ember.aot import deferred
    from tests.aot.test_aot_deferred import _round_trip
    fake, clock = timed
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    gm = make_fx(_small, tracing_mode="fake")(x, w)
    for host_us, device_us in ((4000.0, 1700.0), (500.0, 10_000.0)):
        decided = []
        for warm in (False, True):
            g = aot_cache.rebuild_graph(_round_trip(gm)) if warm else gm
            compiled = auto.wrap_auto(_compiler(fake, clock, host_us, device_us, BIG, []), api=fake)(g, [x, w])
            assert isinstance(compiled, measure.Measured)
            if warm:
                assert deferred.is_deferred(g), "deciding built the graph"
            with torch.no_grad():
                for _ in range(2 + N + 3):
                    torch.testing.assert_close(compiled(x, w)[0], _small(x, w)[0])
            decided.append(auto.DECISIONS[-1][1:])
            cg.reset()
        assert decided[0] == decided[1] and decided[0][0] is (host_us > device_us), decided


@pytest.mark.gpu
def test_host_bound_model_the_estimate_rejects_is_measured_and_replays_on_gpu(monkeypatch):
    """On a GPU: a small MLP (host-bound: a few microsecond kernels) under an estimate that charges
    the host nothing per launch (so it calls every graph device-bound) is measured, replays, and its
    outputs equal eager's."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    import ember
    cg.reset()
    monkeypatch.setattr(auto, "RULE", dataclasses.replace(auto.RULE, host_us_per_launch=0.0))
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.LayerNorm(64), torch.nn.Linear(64, 64),
                            torch.nn.GELU(), torch.nn.Linear(64, 64)).cuda().eval()
    x = torch.randn(8, 64, device="cuda")
    before = len(auto.DECISIONS)
    cm = ember.compile(m)
    with torch.no_grad():
        ref = m(x)
        for _ in range(12):
            out = cm(x)
            torch.testing.assert_close(out, ref, rtol=1e-3, atol=1e-3)
            del out
    decided = auto.DECISIONS[before:]
    assert decided and all(d[1] and d[2].startswith("measured host-bound") for d in decided), decided
    assert cg.stats()["replays"] >= 1, cg.stats()


def test_the_measured_decision_is_logged_under_the_cudagraphs_artifact(timed, caplog):
    import logging

    from ember.diagnostics import logging as elog
    assert "cudagraphs" in elog.ARTIFACTS  # (EMBER_LOGS=cudagraphs prints the ember.cudagraphs logger)
    fake, clock = timed
    x, w = torch.randn(4, 8), torch.nn.Parameter(torch.randn(8, 8))
    with caplog.at_level(logging.INFO, logger="ember.cudagraphs"):
        compiled = auto.wrap_auto(_compiler(fake, clock, 4000.0, 1700.0, BIG, []), api=fake)(make_fx(_small)(x, w), [x, w])
        with torch.no_grad():
            for _ in range(2 + N):
                compiled(x, w)
    lines = [r.getMessage() for r in caplog.records if r.name == "ember.cudagraphs"]
    assert any("deciding by timing" in ln for ln in lines), lines
    assert any("replays as a CUDA graph from now on: measured host-bound: host 4000 us, device 1700 us" in ln
               for ln in lines), lines
