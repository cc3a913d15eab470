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
    runs = [run("eager", [10.0, 9.0], 100.0, cold=1.0), run("ember", [10.0, 9.0001], 50.0, cold=3.0, graphs=2),
            run("torch", [10.0, 9.5], 80.0, cold=12.0, graphs=2)]
    bench.attach_loss_comparison(runs)
    ember, torch_run = runs[1], runs[2]
    assert ember["losses_match_eager"] and not torch_run["losses_match_eager"]
    assert ember["speedup_vs_eager"] == pytest.approx(2.0)
    assert ember["speedup_vs_torch_compile"] == pytest.approx(1.6)
    assert ember["compile_time_vs_torch_compile"] == pytest.approx(0.25)
    # what compiling added beyond eager's own first-step excess (1 s here), ember's against torch's
    assert ember["compile_beyond_eager_s"] == pytest.approx(2.0) and torch_run["compile_beyond_eager_s"] == pytest.approx(11.0)
    assert ember["compile_beyond_eager_vs_torch_compile"] == pytest.approx(2.0 / 11.0)


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


def test_paired_runs_take_their_first_steps_alone_then_turns(monkeypatch):
    """--paired: each compiler's first steps (its compile, its memory) run before the next one is built;
    the steady steps go round-robin; a run that raises is reported and the others go on."""
    order = []

    class FakeRun:
        def __init__(self, model_name, strategy, compiler, args, device, rank):
            order.append(("build", compiler))
            self.compiler, self.n = compiler, 0

        def step(self):
            if self.compiler == "torch" and self.n == 4:
                raise RuntimeError("boom")
            order.append((self.compiler, self.n))
            self.n += 1

        def report(self):
            return dict(compiler=self.compiler, steps=self.n)

        def close(self):
            order.append(("close", self.compiler))

    monkeypatch.setattr(bench, "Run", FakeRun)
    monkeypatch.setattr(bench, "_fresh_memory", lambda device: None)
    args = bench.parse_args(["--device", "cpu", "--tiny", "--steps", "6", "--paired"])
    out = bench.run_paired("gpt2", "ddp", ["eager", "ember", "torch"], args, None, 0,
                           lambda c, exc: dict(compiler=c, error=str(exc)))
    assert out == [dict(compiler="eager", steps=6), dict(compiler="ember", steps=6),
                   dict(compiler="torch", error="boom")]
    warm = bench.WARMUP_STEPS
    assert order[:3 * (warm + 1)] == [x for c in ("eager", "ember", "torch")
                                      for x in [("build", c)] + [(c, i) for i in range(warm)]]
    turns = [x for x in order[3 * (warm + 1):] if x[0] != "close"]
    assert turns[:3] == [("eager", warm), ("ember", warm), ("torch", warm)]
    assert turns[3:] == [("eager", 4), ("ember", 4), ("eager", 5), ("ember", 5)]
    assert order.count(("close", "torch")) == 1
