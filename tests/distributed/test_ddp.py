"""DistributedDataParallel and FSDP2 with ember, on CPU: two gloo processes (``ddp_worker.py``) on
127.0.0.1, launched as subprocesses with a hard timeout, so a deadlock fails the test instead of
hanging it. Gradients and losses must equal eager DDP's over 5 SGD steps; graphs compiled inside a
DDP forward must be split at DDP's buckets (a bucket cap smaller than one Linear: one part per Linear)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="needs torch.distributed with gloo")

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("ddp_worker.py")
LAYERS = 5  # Linear layers of the worker's MLP
TIMEOUT_S = 240


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(tmp_path, names: str, backend: str, world: int = 2) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")
    port = free_port()
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(r), str(world), str(port), str(tmp_path), names,
                               backend], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=TIMEOUT_S)[0])
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail(f"the gloo workers did not finish within {TIMEOUT_S}s (a hang)")
    for r, (p, out) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"rank {r} failed:\n{out[-4000:]}"
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(world)]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Every scenario in one pair of processes (starting them costs more than the scenarios)."""
    return launch(tmp_path_factory.mktemp("ddp"), "outer,inner,nested,no_split,explain,fsdp2", "ember")


def assert_same_training(res):
    (got_losses, got_grads), (want_losses, want_grads) = res["got"], res["want"]
    assert len(got_losses) == 5
    torch.testing.assert_close(torch.tensor(got_losses), torch.tensor(want_losses), rtol=1e-5, atol=1e-6)
    for step, (g, w) in enumerate(zip(got_grads, want_grads)):
        for a, b in zip(g, w):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=lambda m: f"step {step}: {m}")


@pytest.mark.parametrize("name", ["outer", "inner", "nested"])
def test_ddp_gradients_equal_eager_ddp(results, name):
    for rank_results in results:
        assert_same_training(rank_results[name])
    # all-reduced: both ranks hold the same gradients though their batches differ
    torch.testing.assert_close(results[0][name]["got"][1], results[1][name]["got"][1])


@pytest.mark.parametrize("name, parts", [("outer", [LAYERS]), ("inner", [LAYERS]),
                                         ("nested", [1, LAYERS])])  # nested: + the loss after DDP's call
def test_graphs_split_at_ddp_buckets(results, name, parts):
    for rank_results in results:
        assert sorted(rank_results[name]["parts"]) == parts, rank_results[name]["parts"]


def test_optimize_ddp_off_keeps_one_graph(results):
    for rank_results in results:
        assert rank_results["no_split"]["parts"] == [1]


def test_explain_shows_the_split(results):
    res = results[0]["explain"]
    assert res["graphs"] == LAYERS and res["split"] == LAYERS, res["text"]
    assert f"DDP bucket 1 of {LAYERS}" in res["text"] and f"DDP bucket {LAYERS} of {LAYERS}" in res["text"]


def test_fsdp2_gradients_equal_eager_fsdp2(results):
    for rank_results in results:
        res = rank_results["fsdp2"]
        assert_same_training(res)
        # each sharded Linear's forward compiled (its all-gather/reshard hooks run natively)
        assert len(res["parts"]) >= LAYERS, res["parts"]
