"""benchmarks/cpu_suite.py: the harness runs a tiny row end to end (eager, ember cold and warm, each in
its own process; no torch.compile here: Inductor's C++ build is too slow for CI) and writes the JSON
the issue's targets are read from. Shapes and plumbing only: no timed assertions."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SUITE = REPO / "benchmarks" / "cpu_suite.py"
sys.path.insert(0, str(REPO / "benchmarks"))
import cpu_suite  # noqa: E402


def _run(tmp_path, *extra):
    out = tmp_path / "cpu.json"
    res = subprocess.run([sys.executable, str(SUITE), "--quick", "--workloads", "softmax_1k", "--compilers",
                          "eager,ember,ember-warm", "--threads", "1", "--rounds", "3", "--round-s", "0.01",
                          "--budget", "240", "--notes", "test run", "--out", str(out), *extra],
                         capture_output=True, text=True, cwd=REPO, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return json.loads(out.read_text()), res.stdout


def test_tiny_row_json_shape(tmp_path):
    data, stdout = _run(tmp_path, "--ember-env", "EMBER_NO_SUCH_SETTING_FOR_TEST=1")
    assert data["benchmark"] == "cpu_suite" and data["threads"] == 1 and data["quick"] is True
    assert data["machine"]["notes"] == "test run" and data["machine"]["cores_usable"] >= 1
    assert data["ember_env"] == {"EMBER_NO_SUCH_SETTING_FOR_TEST": "1"}
    by = {r["compiler"]: r for r in data["results"]}
    assert set(by) == {"eager", "ember", "ember-warm"}
    for c, r in by.items():
        assert r["status"] == "ok" and r["threads"] == 1 and r["match"] is True and r["rel_err"] <= r["tol"], r
        assert r["first_call_s"] >= 0 and r["import_s"] >= 0
    for c in ("eager", "ember"):  # timed: median, spread and every round
        r = by[c]
        assert len(r["ms_rounds"]) == 3 and r["ms_min"] <= r["ms"] <= r["ms_max"] and r["spread_pct"] >= 0
        assert r["GBps"] > 0 and r["bytes"] == 2 * 64 * 128 * 4
    assert "ms" not in by["ember-warm"]  # the warm process times its compile only
    # the copy ceiling timed alternating with ember's own rounds, in ember's process
    assert by["ember"]["paired_pct_copy"] > 0 and data["rows"][0]["ember_paired_pct_copy"] == by["ember"]["paired_pct_copy"]
    assert by["eager"]["copy_GBps"] > 0 and by["eager"]["clone_GBps"] > 0 and data["rows"][0]["clone_GBps"] > 0
    # an EMBER_* variable this ember does not read is reported, not silently measured as the default
    assert "not a setting" in by["ember"]["ember_settings"]["EMBER_NO_SUCH_SETTING_FOR_TEST"]
    [row] = data["rows"]
    assert row["workload"] == "softmax_1k" and row["ember_check"] == "ok" and row["torch_check"] == "not run"
    assert row["ember_speedup"] == pytest.approx(row["eager_ms"] / row["ember_ms"], rel=1e-2)
    assert row["ember_cold_s"] == by["ember"]["first_call_s"] and row["ember_warm_s"] == by["ember-warm"]["first_call_s"]
    assert row["ember_pct_copy"] > 0 and row["torch_ms"] is None
    assert set(row["targets"]) == {"speedup_ge_1", "pct_copy_ge_70", "warm_le_1s"}
    assert data["geomean"]["ember"] == pytest.approx(row["ember_speedup"], rel=1e-2) and data["geomean"]["torch"] is None
    assert data["markdown"] in stdout and "| softmax_1k |" in data["markdown"]
    assert "Targets met by ember (rows): >= 1.0x eager " in data["markdown"]


def test_wrong_result_fails_the_row():
    """A result off eager's beyond tolerance, or a warm process that failed, is a FAIL in the row."""
    ok = dict(workload="mlp", compiler="eager", status="ok", ms=2.0, spread_pct=1.0, first_call_s=0.0, import_s=0.0,
              rel_err=0.0, tol=1e-3, match=True)
    bad = dict(ok, compiler="ember", ms=1.0, rel_err=0.5, match=False)
    rows, geomean = cpu_suite.summarize([ok, bad], ["mlp"])
    assert rows[0]["ember_check"].startswith("FAIL (ember): rel err 0.5") and rows[0]["ember_speedup"] == 2.0
    crashed = dict(workload="mlp", compiler="ember-warm", status="failed", error="exit 1: boom")
    rows, _ = cpu_suite.summarize([ok, dict(bad, rel_err=0.0, match=True), crashed], ["mlp"])
    assert rows[0]["ember_check"] == "FAIL (ember-warm): exit 1: boom"
    assert cpu_suite.rel_error([cpu_suite_tensor(1.0)], []) == float("inf")  # a missing gradient


def cpu_suite_tensor(v):
    import torch
    return torch.full((2,), v)


def test_bad_ember_env_is_a_clear_error():
    with pytest.raises(SystemExit, match="NAME=VALUE"):
        cpu_suite._env_pairs(["EMBER_NATIVE_CPU"])
