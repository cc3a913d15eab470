"""The report logic of benchmarks/distributed.py, without running any training: loss verdicts
against eager, ember against torch.compile, ranks whose graphs differ, runs skipped by --budget, and
the runs a killed job had finished (salvaged from the ranks' partial files)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location(
    "bench_distributed", Path(__file__).resolve().parents[2] / "benchmarks" / "distributed.py")
bench = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(bench)


def run(compiler, losses, step_ms, cold=0.0, graphs=0, reasons=(), dtype="float32", **extra):
    return dict(model="gpt2", strategy="ddp", compiler=compiler, losses=list(losses), step_ms=step_ms,
                cold_compile_s=cold, graphs=graphs, recompiles=len(reasons), recompile_reasons=list(reasons),
                dtype=dtype, **extra)


def test_loss_verdicts_and_speedups():
    runs = [run("eager", [10.0, 9.0], 100.0), run("ember", [10.0, 9.0001], 50.0, cold=3.0, graphs=2),
            run("torch", [10.0, 9.5], 80.0, cold=12.0, graphs=2)]
    bench.attach_loss_comparison(runs)
    ember, torch_run = runs[1], runs[2]
    assert ember["losses_match_eager"] and not torch_run["losses_match_eager"]
    assert ember["speedup_vs_eager"] == pytest.approx(2.0)
    assert ember["speedup_vs_torch_compile"] == pytest.approx(1.6)
    assert ember["compile_time_vs_torch_compile"] == pytest.approx(0.25)


def test_ranks_that_differ_are_reported():
    same = [[run("ember", [1.0], 1.0, graphs=3)], [run("ember", [1.0], 1.0, graphs=3)]]
    assert bench.compare_ranks(same) == []
    differ = [[run("ember", [1.0], 1.0, graphs=3)],
              [run("ember", [1.0], 1.0, graphs=4, reasons=["x.shape[1] changed: 32 -> 40"])]]
    (problem,) = bench.compare_ranks(differ)
    assert problem["run"] == "gpt2/ddp/ember" and problem["per_rank"][1]["recompiles"] == 1
    skipped = [[dict(model="gpt2", strategy="ddp", compiler="ember", skipped="budget")]] * 2
    assert bench.compare_ranks(skipped) == []


def test_a_killed_job_keeps_its_finished_runs(tmp_path, capsys):
    args = bench.parse_args(["--device", "cpu", "--tiny", "--nproc", "2", "--out", str(tmp_path / "r.json")])
    for rank in range(2):  # rank 1 was killed before finishing its second run
        runs = [run("eager", [5.0], 10.0), run("ember", [5.0], 5.0, graphs=1)][:2 - rank]
        Path(bench.partial_path(args.out, rank)).write_text(json.dumps(runs))
    bench.salvage(args)
    report = json.loads(Path(args.out).read_text())
    assert report["complete"] is False and [len(r) for r in report["per_rank"]] == [2, 1]
    assert report["per_rank"][0][1]["losses_match_eager"]
    assert not list(tmp_path.glob("*.partial"))
    assert "incomplete" in capsys.readouterr().out
