"""A measured CUDA-graph decision is stored with the graph's cache entry (ember/cudagraphs/stored.py)
and a later process loading the same graph on the same kind of device and host takes it instead of
measuring (issue 28: a compiling and a warm process of ResNet-50 inference measured different sides
of the threshold). The "next process" here is a second ``wrap_auto`` of a graph with the same cache
key; its compiled function is timed to decide the other way, so only a reused decision agrees with
the first. Host and device clocks are the fake ones of test_measure; nothing is timed for real."""
import dataclasses
import glob
import logging
import os

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import ember.cudagraphs as cg
from ember.config import config
from ember.cudagraphs import auto, measure, stored
from tests.cudagraphs.test_measure import BIG, N, Clock, _small

KEY = "ab" * 32  # a native graph's cache key (ember_native["key"])


@pytest.fixture
def timed(fake, monkeypatch, tmp_path):
    monkeypatch.setattr(config, "auto_cudagraphs", True)
    clock = Clock()
    monkeypatch.setattr(measure, "_now", clock)
    return fake, clock, str(tmp_path)


def _compiler(fake, clock, host_us, device_us, cache_dir, key=KEY):
    """A native-like compiler whose graph is in the cache under ``key`` (None: the cache is off)."""
    def compiler(gm, example_inputs):
        def run(*args):
            clock.t += host_us * 1e-6
            fake.device_clock += device_us
            return gm(*args)
        run.ember_native = {"report": dict(BIG)}
        if key is not None:
            run.ember_native.update(key=key, cache_dir=cache_dir)
        return run
    return compiler


def _process(fake, clock, host_us, device_us, cache_dir, key=KEY, calls=2 + N + 3):
    """One process: compile the graph, call it ``calls`` times; (compiled object, its decision)."""
    x, w = torch.randn(4, 8), torch.nn.Parameter(torch.randn(8, 8))
    compiled = auto.wrap_auto(_compiler(fake, clock, host_us, device_us, cache_dir, key), api=fake)(make_fx(_small)(x, w), [x, w])
    with torch.no_grad():
        for _ in range(calls):
            xi = torch.randn(4, 8)
            torch.testing.assert_close(compiled(xi, w)[0], _small(xi, w)[0])
    return compiled, auto.DECISIONS[-1]


HOST_BOUND, DEVICE_BOUND = (4000.0, 1700.0), (500.0, 10_000.0)


@pytest.mark.parametrize("first,second", [(HOST_BOUND, DEVICE_BOUND), (DEVICE_BOUND, HOST_BOUND)])
def test_the_next_process_reuses_the_measured_decision(timed, first, second):
    fake, clock, cache_dir = timed
    compiled, (_, replay, why) = _process(fake, clock, *first, cache_dir)
    assert isinstance(compiled, measure.Measured) and replay is (first == HOST_BOUND)
    assert len(glob.glob(os.path.join(cache_dir, "native", "graphs", KEY[:2], f"{KEY}.cudagraph-*.json"))) == 1
    syncs = getattr(fake, "syncs", 0)
    cg.reset()
    again, (_, replay2, why2) = _process(fake, clock, *second, cache_dir)
    assert not isinstance(again, measure.Measured), "measured again instead of reusing the stored decision"
    assert getattr(fake, "syncs", 0) == syncs  # (nothing timed: no synchronization)
    assert replay2 is replay and why2 == f"reused measured decision: {why}"
    assert isinstance(again, cg.Runner) is replay
    if replay:
        assert cg.stats()["replays"] >= 1


def test_a_reused_decision_is_logged(timed, caplog):
    fake, clock, cache_dir = timed
    _process(fake, clock, *HOST_BOUND, cache_dir)
    with caplog.at_level(logging.INFO, logger="ember.cudagraphs"):
        _process(fake, clock, *DEVICE_BOUND, cache_dir)
    lines = [r.getMessage() for r in caplog.records if r.name == "ember.cudagraphs"]
    assert any("replays as a CUDA graph: reused measured decision: measured host-bound: host 4000 us" in ln
               for ln in lines), lines


@pytest.mark.parametrize("change", ["device", "cpu", "rule", "graph"])
def test_another_device_host_rule_or_graph_measures_again(timed, monkeypatch, change):
    fake, clock, cache_dir = timed
    _process(fake, clock, *HOST_BOUND, cache_dir)
    key = KEY
    if change == "device":
        fake.name_of_device = "another device"
    elif change == "cpu":
        monkeypatch.setattr(stored, "cpu_model", lambda: "another CPU")
    elif change == "rule":
        monkeypatch.setattr(auto, "RULE", dataclasses.replace(auto.RULE, measured_host_fraction=0.5))
    else:
        key = "cd" * 32
    again, (_, replay, why) = _process(fake, clock, *DEVICE_BOUND, cache_dir, key=key)
    assert isinstance(again, measure.Measured) and not replay and why.startswith("measured device-bound")


def test_without_a_cache_key_every_process_measures_and_nothing_is_stored(timed):
    fake, clock, cache_dir = timed
    _process(fake, clock, *HOST_BOUND, cache_dir, key=None)
    again, (_, replay, _) = _process(fake, clock, *DEVICE_BOUND, cache_dir, key=None)
    assert isinstance(again, measure.Measured) and not replay
    assert not glob.glob(os.path.join(cache_dir, "**", "*.cudagraph-*.json"), recursive=True)


def test_a_corrupt_entry_is_measured_again(timed):
    fake, clock, cache_dir = timed
    _process(fake, clock, *HOST_BOUND, cache_dir)
    (path,) = glob.glob(os.path.join(cache_dir, "native", "graphs", KEY[:2], f"{KEY}.cudagraph-*.json"))
    with open(path, "r+b") as f:
        data = f.read()
        f.seek(len(data) - 5)
        f.write(b"xxxxx")
    again, (_, replay, why) = _process(fake, clock, *DEVICE_BOUND, cache_dir)
    assert isinstance(again, measure.Measured) and not replay and why.startswith("measured device-bound")
    # and the new measurement replaces the bad entry
    third, (_, replay3, why3) = _process(fake, clock, *HOST_BOUND, cache_dir)
    assert not isinstance(third, measure.Measured) and not replay3 and why3.startswith("reused measured decision")


def test_a_decided_graph_leaves_the_call_path(timed):
    """Once decided, the aot inference variant calls the runner (or the compiled function) directly,
    as in a process that reused the decision: no call goes through the Measured object."""
    from ember.aot import aot_autograd
    fake, clock, cache_dir = timed

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(8, 8))

        def forward(self, x):
            return ((x @ self.w).relu() + 1,)
    m = M()
    x = torch.randn(4, 8)
    backend = aot_autograd(inference_compiler=auto.wrap_auto(_compiler(fake, clock, *HOST_BOUND, cache_dir), api=fake),
                           strict=True)
    with torch.no_grad():
        compiled = backend(torch.fx.symbolic_trace(m), [x])
        (variant,) = compiled.variants.values()
        assert isinstance(variant.compiled, measure.Measured)
        measured = variant.compiled
        for _ in range(2 + N + 3):
            xi = torch.randn(4, 8)
            torch.testing.assert_close(compiled(xi)[0], m(xi)[0])
    assert measured.decision[0]
    assert isinstance(variant.compiled, cg.Runner) and variant.compiled is measured.runner
    assert cg.stats()["replays"] >= 1


def test_on_decided_after_the_decision_is_called_at_once(timed):
    fake, clock, cache_dir = timed
    compiled, _ = _process(fake, clock, *DEVICE_BOUND, cache_dir)
    got = []
    compiled.on_decided(got.append)
    assert got == [compiled.fn]


def test_a_native_graph_carries_its_cache_key(tmp_path):
    """What a decision is stored under: the native graph's cache key and cache directory (none when
    the cache is off)."""
    from ember.native.backend import compile_aten_graph
    x = torch.randn(16)
    gm = make_fx(lambda x: (x * 2 + 1,))(x)
    fn = compile_aten_graph(gm, [x], force_triton=True, options={"cache_dir": str(tmp_path)})
    info = fn.ember_native
    assert len(info["key"]) == 64 and info["cache_dir"] == str(tmp_path)
    assert os.path.exists(os.path.join(tmp_path, "native", "graphs", info["key"][:2], f"{info['key']}.json"))
    off = compile_aten_graph(gm, [x], force_triton=True, options={"cache": False, "cache_dir": str(tmp_path)})
    assert "key" not in off.ember_native


def test_timing_waits_for_embers_background_threads(timed, monkeypatch, tmp_path):
    """A prewarm thread still running at the second call (a warm start never waits for it otherwise)
    is waited for before the first timed call: it would take the GIL from the timed calls."""
    import threading
    import time

    from ember.native import runtime
    fake, clock, cache_dir = timed
    release, done = threading.Event(), []

    def prewarm():
        release.wait(30)
        time.sleep(0.3)  # (still working when the second call comes, unless that call waits for it)
        done.append(1)
    t = threading.Thread(target=prewarm, daemon=True)
    t.start()
    monkeypatch.setattr(runtime, "_PREWARM", t)
    seen = []
    x, w = torch.randn(4, 8), torch.nn.Parameter(torch.randn(8, 8))

    def compiler(gm, example_inputs):
        def run(*args):
            seen.append(bool(done))
            if len(seen) == 1:
                release.set()  # (set by the untimed first call: the thread ends on its own)
            clock.t += 4000e-6
            fake.device_clock += 1700.0
            return gm(*args)
        run.ember_native = {"report": dict(BIG)}
        return run
    compiled = auto.wrap_auto(compiler, api=fake)(make_fx(_small)(x, w), [x, w])
    with torch.no_grad():
        for _ in range(2 + N):
            compiled(x, w)
    assert seen[0] is False and all(seen[1:1 + N]), seen


_GPU_SCRIPT = """
import dataclasses, json, torch, ember
from ember.cudagraphs import auto
auto.RULE = dataclasses.replace(auto.RULE, host_us_per_launch=0.0)  # the estimate says device-bound: measured
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.LayerNorm(64), torch.nn.Linear(64, 64),
                        torch.nn.GELU(), torch.nn.Linear(64, 64)).cuda().eval()
x = torch.randn(8, 64, device="cuda")
cm = ember.compile(m)
with torch.no_grad():
    ref = m(x)
    for _ in range(12):
        out = cm(x)
    torch.testing.assert_close(out, ref, rtol=1e-3, atol=1e-3)
print("DECISIONS " + json.dumps(auto.DECISIONS))
"""


@pytest.mark.gpu
def test_a_warm_process_reuses_the_compiling_process_decision_on_gpu(tmp_path):
    """Two real processes on one cache directory: the compiling one measures, the warm one logs
    "reused measured decision" and takes the same decision."""
    import json
    import subprocess
    import sys
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, EMBER_CACHE_DIR=str(tmp_path / "ember"), TRITON_CACHE_DIR=str(tmp_path / "triton"),
               PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    got = []
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", _GPU_SCRIPT], env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        got.append(json.loads([ln for ln in r.stdout.splitlines() if ln.startswith("DECISIONS ")][-1][10:]))
    cold, warm = got
    assert cold and all(d[2].startswith("measured ") for d in cold), cold
    assert [d[1] for d in warm] == [d[1] for d in cold], (cold, warm)
    assert all(d[2].startswith("reused measured decision: measured ") for d in warm), warm
