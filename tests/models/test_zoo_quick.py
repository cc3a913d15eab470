"""The model zoo runner (benchmarks/zoo.py) on three tiny Hugging Face models, without the peer: each
model runs in its own process, works, matches eager, and lands in the JSON and markdown reports.
A model that overruns its time limit is recorded as such and the run still completes."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[2]
ZOO = REPO / "benchmarks" / "zoo.py"


def _zoo(*args):
    return subprocess.run([sys.executable, str(ZOO), "--device", "cpu", "--no-peer", "--quick", "--threads", "1",
                           *args], capture_output=True, text=True, cwd=REPO, timeout=300)


def test_three_models(tmp_path):
    out = tmp_path / "zoo.json"
    res = _zoo("--models", "bert,gpt2,vit", "--jobs", "2", "--out", str(out))  # 2 at once: only the checks matter here
    assert res.returncode == 0, res.stderr[-2000:]
    report = json.loads(out.read_text())
    models = {m["name"]: m for m in report["models"]}
    assert list(models) == ["bert", "gpt2", "vit"]
    for name, m in models.items():
        assert m["status"] == "ok", (name, m.get("error"))
        assert m["match"] and m["max_abs_err"] < 1e-4
        assert m["graphs"] >= 1 and m["graph_breaks"] == 0, (name, m["break_reasons"])
        assert m["compiled_ms"] > 0 and m["eager_ms"] > 0 and "peer" not in m
    (summary,) = [r for r in report["summary"] if r["suite"] == "all"]
    assert summary["models"] == summary["working"] == summary["zero_breaks"] == 3
    md = out.with_suffix(".md").read_text()
    assert "| suite | models | working | 0 breaks | 1-9 breaks | 10+ breaks |" in md
    assert "| huggingface | 3 | 3 | 3 | 0 | 0 |" in md


def test_a_model_over_its_time_limit_is_recorded(tmp_path):
    out = tmp_path / "zoo.json"
    res = _zoo("--models", "resnet", "--timeout", "0.5", "--out", str(out))
    assert res.returncode == 0, res.stderr[-2000:]
    (m,) = json.loads(out.read_text())["models"]
    assert m["status"] == "timeout" and "over" in m["error"]
