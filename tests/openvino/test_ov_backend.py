"""The openvino backends' behaviour around the conversion: options and environment variables,
fallbacks, frozen weights, output buffers, threads, model caching across processes, openvino_ts."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.openvino.conftest import require_openvino  # noqa: E402

require_openvino()

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import ember  # noqa: E402
from ember.backends.openvino import options as ov_options  # noqa: E402
from tests.openvino.helpers import F32, ov_ops, rel_err  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def convnet():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 8 * 8, 4)).eval()


def run(model, x, options=F32):
    compiled = ember.compile(model, backend="openvino", options=options)
    with torch.no_grad():
        return compiled, compiled(x), model(x)


# ---- options, environment variables ----------------------------------------------------------------

def test_unknown_option_names_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown option\(s\) 'devcie'.*valid options: aot_autograd, cache_dir, "
                                         r"config, decompositions, device, disabled_ops, model_caching"):
        ember.compile(convnet(), backend="openvino", options={"devcie": "CPU"})


@pytest.mark.parametrize("options, error, match", [
    ({"device": 3}, TypeError, "option 'device' of backend 'openvino' must be str"),
    ({"config": ["f32"]}, TypeError, "must be dict"),
    ({"disabled_ops": "aten.relu"}, TypeError, "must be list"),
])
def test_badly_typed_options_fail_at_compile(options, error, match):
    with pytest.raises(error, match=match):
        ember.compile(convnet(), backend="openvino", options=options)


@pytest.mark.parametrize("options, match", [
    ({"device": "NPU7"}, r"'NPU7' is not available; devices here: CPU"),
    ({"config": {"INFERENCE_PRECISION": "f32"}}, r"unknown or read-only property 'INFERENCE_PRECISION'.*valid: .*"
                                                 r"INFERENCE_PRECISION_HINT"),
    ({"config": {"PERFORMANCE_HINT": "FASTEST"}}, r"'PERFORMANCE_HINT': 'FASTEST'.* rejected by OpenVINO"),
    ({"disabled_ops": ["aten.relux.default"]}, r"no op named 'aten.relux.default'"),
    ({"disabled_ops": ["aten.relu.tensor"]}, r"overloads of aten.relu: default"),
    ({"decompositions": ["aten.gelu"]}, r"takes OpOverloads"),
    ({"aot_autograd": "maybe"}, r"'aot_autograd' must be a bool"),
])
def test_bad_option_values_raise_clear_errors(options, match):
    compiled = ember.compile(convnet(), backend="openvino", options=options)
    with pytest.raises(ember.BackendCompilerFailed, match=match) as info, torch.no_grad():  # checked at compile
        compiled(torch.randn(1, 3, 8, 8))
    assert isinstance(info.value.__cause__, (ValueError, TypeError))


def test_mode_is_rejected():
    with pytest.raises(ember.BackendCompilerFailed, match="takes no mode") as info, torch.no_grad():
        ember.compile(convnet(), backend="openvino", mode="max-autotune")(torch.randn(1, 3, 8, 8))
    assert isinstance(info.value.__cause__, ValueError)


def test_environment_variables_set_defaults_and_options_win(monkeypatch, tmp_path):
    monkeypatch.setenv("OPENVINO_TORCH_BACKEND_DEVICE", "GPU.3")
    monkeypatch.setenv("OPENVINO_TORCH_MODEL_CACHING", "1")
    monkeypatch.setenv("OPENVINO_TORCH_CACHE_DIR", str(tmp_path / "envcache"))
    opts = ov_options.resolve({})
    assert (opts.device, opts.model_caching, opts.cache_dir) == ("GPU.3", True, str(tmp_path / "envcache"))
    opts = ov_options.resolve({"device": "CPU", "model_caching": False, "cache_dir": "elsewhere"})
    assert (opts.device, opts.model_caching, opts.cache_dir) == ("CPU", False, "elsewhere")
    monkeypatch.setenv("OPENVINO_TORCH_MODEL_CACHING", "false")
    assert not ov_options.resolve({}).model_caching
    # OpenVINO's own CACHE_DIR property wins over cache_dir, as in OpenVINO's integration
    assert ov_options.resolve({"config": {"CACHE_DIR": "ovdir"}}).cache_dir == "ovdir"


def test_environment_device_is_used(monkeypatch):
    monkeypatch.setenv("OPENVINO_TORCH_BACKEND_DEVICE", "NPU7")
    compiled = ember.compile(convnet(), backend="openvino")
    with pytest.raises(ember.BackendCompilerFailed, match="'NPU7' is not available") as info, torch.no_grad():
        compiled(torch.randn(1, 3, 8, 8))
    assert isinstance(info.value.__cause__, ValueError)


def test_environment_caching_writes_to_the_environment_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("OPENVINO_TORCH_MODEL_CACHING", "1")
    monkeypatch.setenv("OPENVINO_TORCH_CACHE_DIR", str(tmp_path))
    _, got, expected = run(convnet(), torch.randn(1, 3, 8, 8))
    assert rel_err(got, expected) < 1e-4
    assert list((tmp_path / "ember_openvino" / "ir").rglob("*.xml"))


def test_disabled_ops_accepts_names_and_objects():
    names = {op for op in ov_options.resolve({"disabled_ops": [
        torch.ops.aten.relu.default, torch.ops.aten.gelu, "torch.ops.aten.mm.default", "aten.bmm"]}).disabled_ops}
    assert names == {"aten.relu.default", "aten.gelu", "aten.mm.default", "aten.bmm"}


def test_import_error_names_the_extra(monkeypatch):
    from ember.backends.openvino import convert
    monkeypatch.setitem(sys.modules, "openvino", None)
    with pytest.raises(ImportError, match=r"pip install 'ember\[openvino\]'"):
        convert._import_openvino()


def test_importing_ember_does_not_import_openvino():
    code = "import sys, ember; import ember.backends.openvino; print('openvino' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=ROOT), check=True).stdout
    assert out.strip() == "False"


# ---- partitioning and fallbacks ----------------------------------------------------------------------

@pytest.mark.parametrize("disabled", [["aten.relu.default"], [torch.ops.aten.relu.default], [torch.ops.aten.relu]])
def test_disabled_op_runs_in_pytorch(disabled, reports):
    x = torch.randn(2, 3, 8, 8)
    _, got, expected = run(convnet(), x, dict(F32, disabled_ops=disabled))
    assert rel_err(got, expected) < 1e-4
    [report] = reports()
    assert "aten.relu.default" in report["torch_ops"]
    assert "aten.relu.default" not in ov_ops(reports())
    assert "aten.convolution.default" in ov_ops(reports())
    assert "disabled by the disabled_ops option" in report["kept_in_pytorch"].values()
    assert report["threads_limited"]  # a graph mixing both runtimes runs its PyTorch ops on one thread


def test_op_without_a_conversion_rule_is_split_out(reports):
    def f(x, w):
        y = torch.relu(nn.functional.conv2d(x, w, padding=1))
        y = torch.special.bessel_j0(y)  # no OpenVINO conversion rule
        return torch.relu(nn.functional.conv2d(y, w, padding=1)).mean((2, 3))

    x, w = torch.randn(1, 4, 8, 8), torch.randn(4, 4, 3, 3)
    compiled = ember.compile(f, backend="openvino", options=F32)
    with torch.no_grad():
        assert rel_err(compiled(x, w), f(x, w)) < 1e-4
    [report] = reports()
    assert "aten.special_bessel_j0.default" in report["torch_ops"]
    assert len(report["partitions"]) == 2


def test_conversion_failure_falls_back_to_native(monkeypatch, reports):
    from ember.backends.openvino import convert

    def broken(sub, signature):
        raise RuntimeError("simulated conversion failure")

    monkeypatch.setattr(convert, "to_ov_model", broken)
    _, got, expected = run(convnet(), torch.randn(1, 3, 8, 8))
    assert torch.allclose(got, expected)
    [report] = reports()
    assert not report["partitions"]
    assert "simulated conversion failure" in report["native_partitions"][0]["reason"]


def test_runtime_failure_switches_the_partition_to_pytorch(monkeypatch):
    from ember.backends.openvino.runtime import OVPartition
    model, x = convnet(), torch.randn(1, 3, 8, 8)
    compiled, _, _ = run(model, x)
    monkeypatch.setattr(OVPartition, "_infer", lambda self, args: 1 / 0)
    with torch.no_grad():
        assert rel_err(compiled(x), model(x)) < 1e-5
        assert rel_err(compiled(x * 2), model(x * 2)) < 1e-5


def test_extra_decompositions(reports):
    model = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 2)).eval()
    x = torch.randn(3, 8)
    _, got, expected = run(model, x, dict(F32, decompositions=[torch.ops.aten.gelu.default]))
    assert rel_err(got, expected) < 1e-4
    assert "aten.gelu.default" not in ov_ops(reports()) and "aten.erf.default" in ov_ops(reports())


# ---- outputs, weights, threads -------------------------------------------------------------------------

def test_outputs_kept_across_calls_stay_intact():
    model = convnet()
    compiled = ember.compile(model, backend="openvino", options=F32)
    xs = [torch.randn(1, 3, 8, 8) for _ in range(6)]
    with torch.no_grad():
        kept = [compiled(x) for x in xs]              # more results than the buffer pool holds
        view = compiled(xs[0])[0, :2]                 # a view keeps its buffer busy too
        for _ in range(3):
            compiled(torch.randn(1, 3, 8, 8))
        for x, y in zip(xs, kept):
            assert rel_err(y, model(x)) < 1e-4
        assert rel_err(view, model(xs[0])[0, :2]) < 1e-4


def test_buffers_are_reused_once_released():
    compiled = ember.compile(convnet(), backend="openvino", options=F32)
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        ptrs = set()
        for _ in range(8):
            y = compiled(x)  # the previous y is still alive during the call: two buffers alternate
            ptrs.add(y.data_ptr())
    assert len(ptrs) <= 3


def test_in_place_weight_update_is_seen():
    model = convnet()
    compiled = ember.compile(model, backend="openvino", options=F32)
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        compiled(x)
        model[0].weight.mul_(2)                       # in place: version counter changes
        assert rel_err(compiled(x), model(x)) < 1e-4
        model.load_state_dict(convnet().state_dict())  # copy_ into every parameter and buffer
        assert rel_err(compiled(x), model(x)) < 1e-4


def test_aot_autograd_keeps_weights_as_inputs(reports):
    model = convnet()
    x = torch.randn(1, 3, 8, 8)
    compiled, got, expected = run(model, x, dict(F32, aot_autograd=True))
    assert rel_err(got, expected) < 1e-4
    assert all(p["constants"] == 0 for r in reports() for p in r["partitions"])
    with torch.no_grad():
        model[0].weight.mul_(2)
        assert rel_err(compiled(x), model(x)) < 1e-4
    assert len(reports()) == 1  # no rebuild needed


def test_thread_count_restored_and_user_setting_respected(reports):
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # other tests (the breaks harness) leave the process at one thread
    try:
        x = torch.randn(1, 3, 8, 8)
        run(convnet(), x, dict(F32, disabled_ops=["aten.relu"]))
        assert torch.get_num_threads() == 2
        run(convnet(), x, {"disabled_ops": ["aten.relu"], "config": {"INFERENCE_NUM_THREADS": 1}})
        assert [r["threads_limited"] for r in reports()] == [True, False]
    finally:
        torch.set_num_threads(before)


# ---- model caching across processes -------------------------------------------------------------------

CACHE_SCRIPT = textwrap.dedent("""
    import json, sys, time, torch, ember
    from ember.backends import openvino
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 4, 3), torch.nn.Flatten()).eval()
    x = torch.randn(2, 3, 10, 10)
    opts = {"model_caching": True, "cache_dir": sys.argv[1], "config": {"INFERENCE_PRECISION_HINT": "f32"}}
    compiled = ember.compile(model, backend="openvino", options=opts)
    with torch.no_grad():
        y = compiled(x)
        err = float((y - model(x)).abs().max())
    print(json.dumps({"err": err, "reports": len(openvino.reports()), "sum": float(y.double().sum())}))
""")


def test_model_cache_is_reused_by_a_second_process(tmp_path):
    script = tmp_path / "cached.py"
    script.write_text(CACHE_SCRIPT)
    cache_dir = tmp_path / "cache"
    env = dict(os.environ, PYTHONPATH=ROOT, EMBER_LOGS="openvino")
    runs = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, str(script), str(cache_dir)], capture_output=True, text=True,
                              cwd=ROOT, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append((json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr))
    (first, first_log), (second, second_log) = runs
    assert first["err"] < 1e-4 and second["err"] < 1e-4 and first["sum"] == second["sum"]
    assert "converted" in first_log and "recorded graph" in first_log
    # the second process neither traced nor converted: it replayed the recorded OpenVINO model
    assert "replaying a recorded graph" in second_log and "converted" not in second_log
    assert second["reports"] == 0
    assert len(list((cache_dir / "ember_openvino" / "ir").rglob("*.xml"))) == 1
    assert list((cache_dir / "ember_openvino" / "blobs").iterdir())  # OpenVINO's compiled-blob cache


def test_changed_weights_miss_the_cache(tmp_path, reports):
    opts = dict(F32, model_caching=True, cache_dir=str(tmp_path))
    x = torch.randn(1, 3, 8, 8)
    for seed in (0, 1):
        torch.manual_seed(seed)
        _, got, expected = run(convnet(), x, opts)
        assert rel_err(got, expected) < 1e-4
    assert [p["cache_hit"] for r in reports() for p in r["partitions"]] == [False, False]


# ---- openvino_ts ---------------------------------------------------------------------------------------

def test_openvino_ts_matches_eager():
    model = convnet()
    x = torch.randn(2, 3, 8, 8)
    compiled = ember.compile(model, backend="openvino_ts", options=F32)
    with torch.no_grad():
        assert rel_err(compiled(x), model(x)) < 1e-4
        assert rel_err(compiled(x * 2), model(x * 2)) < 1e-4
    # a call that needs gradients runs the PyTorch graph, so backward works
    out = compiled(x)
    out.sum().backward()
    assert model[0].weight.grad is not None


def test_openvino_ts_rejects_partitioning_options():
    with pytest.raises(ValueError, match="unknown option.*'disabled_ops'.*valid options: cache_dir, config, device"):
        ember.compile(convnet(), backend="openvino_ts", options={"disabled_ops": ["aten.relu"]})


def test_openvino_ts_leaves_in_place_graphs_to_pytorch():
    def f(x):
        y = x * 2
        x.add_(1)  # OpenVINO would not write back into x
        return y

    compiled = ember.compile(f, backend="openvino_ts")
    a, b = torch.ones(4), torch.ones(4)
    with torch.no_grad():
        assert torch.equal(compiled(a), f(b)) and torch.equal(a, b)


def test_lower_default_precision_is_announced(monkeypatch):
    from ember.backends.openvino import convert

    class Compiled:
        def get_property(self, name):
            return "<Type: 'bfloat16'>"

    monkeypatch.setattr(convert, "_precision_noted", False)
    with pytest.warns(UserWarning, match="INFERENCE_PRECISION_HINT': 'f32'"):
        convert._note_precision(Compiled(), ov_options.resolve({}))
    monkeypatch.setattr(convert, "_precision_noted", False)
    convert._note_precision(Compiled(), ov_options.resolve(F32))  # the user chose: no warning
    assert not convert._precision_noted
