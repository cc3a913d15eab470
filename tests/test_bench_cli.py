"""`ember bench`: the printed table is the JSON, the chart is drawn, the peer comes from the checkout's
script (ember never calls torch.compile itself), and a missing peer script is a clear error."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ember import cli
from ember.bench import report

REPO = Path(__file__).resolve().parents[1]
FAST = ["--workloads", "pointwise,softmax", "--warmup", "1", "--iters", "3", "--no-progress", "--threads", "1"]


def _bench(*args):
    return subprocess.run([sys.executable, "-m", "ember.cli", "bench", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=300)


def test_table_matches_json_and_plot(tmp_path):
    pytest.importorskip("matplotlib")
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    res = _bench(*FAST, "--suite", "quick", "--device", "cpu", "--backends", "ember,eager", "--json", str(out),
                 "--plot", str(png))
    assert res.returncode == 0, res.stderr
    data = json.loads(out.read_text())
    rows = [(r["workload"], r["variant"]) for r in data["results"]]
    assert rows == [(w, v) for w in ("pointwise", "softmax") for v in ("eager", "ember", "ember:eager")]
    assert all(r["status"] == "ok" and r["match"] for r in data["results"])
    assert report.table(data) in res.stdout  # the printed table is rendered from the saved report
    for r in data["results"]:
        line = next(ln for ln in res.stdout.splitlines() if ln.split()[:2] == [r["workload"], r["variant"]])
        assert f"{r['ms']:.3f}" in line and f"{r['speedup']:.2f}x" in line
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"


def test_peer_column_from_the_checkout_script(tmp_path):
    out = tmp_path / "bench.json"
    # the peer's "eager" backend keeps this fast: the point is the plumbing, not Inductor's compile time
    res = _bench(*FAST, "--workloads", "pointwise", "--device", "cpu", "--with-torch-compile", "--peer-backend",
                 "eager", "--json", str(out))
    assert res.returncode == 0, res.stderr
    peer = [r for r in json.loads(out.read_text())["results"] if r["variant"] == "torch.compile:eager"]
    assert len(peer) == 1 and peer[0]["status"] == "ok" and peer[0]["speedup"] > 0
    assert "bench_peer.py" in json.loads(out.read_text())["peer"]


def test_missing_peer_script_is_a_clear_error(tmp_path, capsys):
    assert cli.main(["bench", *FAST, "--with-torch-compile", "--peer-script", str(tmp_path / "nope.py")]) == 2
    err = capsys.readouterr().err
    assert "--peer-script" in err and "no such file" in err


def test_unknown_workload_is_a_clear_error(capsys):
    assert cli.main(["bench", "--suite", "quick", "--workloads", "resnet9000"]) == 2
    err = capsys.readouterr().err
    assert "resnet9000" in err and "pointwise" in err
