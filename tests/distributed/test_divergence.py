"""Guard divergence across ranks (issue 31): two gloo processes on CPU compile a function whose
branch depends on the rank. ``ember.config.distributed_check = "raise"`` must raise
DivergentCompileError naming both ranks and what differs, before the divergent graph runs, and
never hang (the processes have a hard timeout); "warn" must warn; "off" must stay silent; ranks that
compile alike must see nothing."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.distributed.test_ddp import REPO, free_port

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="needs torch.distributed with gloo")
WORKER = Path(__file__).with_name("divergence_worker.py")
TIMEOUT_S = 180


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("divergence")
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    port = free_port()
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(r), "2", str(port), str(out)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    try:
        logs = [p.communicate(timeout=TIMEOUT_S)[0] for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail(f"the ranks did not finish within {TIMEOUT_S}s: a divergence hung instead of being reported")
    for r, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"rank {r} failed:\n{log[-4000:]}"
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


def test_ranks_that_compile_alike_see_nothing(results):
    for res in results:
        assert res["same"]["error"] is None and res["same"]["divergences"] == 0, res["same"]


def test_a_recompile_on_one_rank_only_raises_there(results):
    r0, r1 = results[0]["extra_recompile"], results[1]["extra_recompile"]
    assert r0["error"] is None and r0["calls"] == 2  # rank 0 hit its cache: it compiled nothing to compare
    err = r1["error"]
    assert err is not None and r1["calls"] == 1, r1  # raised at the recompile, before its graph ran
    assert "rank 1 compiled graph #2" in err and "rank 0 has compiled only 1 graph" in err, err
    assert "flag changed: False -> True" in err, err  # why rank 1 recompiled


def test_different_graphs_raise_on_both_ranks(results):
    for rank, res in enumerate(results):
        err = res["differ"]["error"]
        assert err is not None and res["differ"]["calls"] == 0, res["differ"]
        assert f"ranks {rank} and {1 - rank} compiled different graphs" in err, err
        assert "guard CONST flag = False" in err and "guard CONST flag = True" in err, err


def test_warn_mode_warns_once_and_runs(results):
    for res in results:
        w = res["differ_warn"]
        assert w["error"] is None and w["calls"] == 2, w
        assert w["divergences"] == 1, w  # once: after a divergence the compile numbers no longer line up
    assert any("compiled different graphs" in m for res in results for m in res["differ_warn"]["warnings"])


def test_off_compares_nothing(results):
    for res in results:
        assert res["off"]["error"] is None and res["off"]["divergences"] == 0 and res["off"]["calls"] == 1
