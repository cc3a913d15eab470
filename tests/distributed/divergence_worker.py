"""One rank of test_divergence.py (``python divergence_worker.py RANK WORLD PORT OUT_DIR``): compiled
functions whose guards pass on one rank and fail on the other, under each ember.config.distributed_check
mode. Every scenario records the error or warnings it saw; nothing here may hang (the test kills it)."""
from __future__ import annotations

import datetime
import os
import sys
import time
import warnings

import torch
import torch.distributed as dist

import ember
from ember.diagnostics import counters
from ember.distributed import divergence

TIMEOUT = datetime.timedelta(seconds=60)


def step(x, flag: bool):
    y = torch.sin(x) * 2
    if flag:  # the branch one rank takes
        y = y + torch.cos(x)
    return y


def run(mode: str, flags: list) -> dict:
    """Call a fresh compile of ``step`` once per flag (this rank's flags); then all ranks meet again."""
    ember.config.distributed_check = mode
    divergence.reset()
    before = counters.snapshot()["distributed_divergence"]
    fn = ember.compile(step, backend="eager")
    error, outputs = None, []
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            for flag in flags:
                outputs.append(fn(torch.ones(4), flag))
        except ember.DivergentCompileError as exc:
            error = str(exc)
        dist.monitored_barrier(timeout=TIMEOUT)
        deadline = time.monotonic() + 20  # warn mode: a background thread compares late arrivals
        while mode == "warn" and time.monotonic() < deadline and \
                counters.snapshot()["distributed_divergence"] == before:
            time.sleep(0.1)
    dist.monitored_barrier(timeout=TIMEOUT)
    return dict(error=error, warnings=[str(w.message) for w in seen if "ember: rank" in str(w.message)],
                divergences=counters.snapshot()["distributed_divergence"] - before, calls=len(outputs))


def main(rank: int, world: int, port: int, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=TIMEOUT)
    ember.config.distributed_check_timeout = 3
    one = rank == 1
    results = {}
    try:
        results["same"] = run("raise", [False, True])                 # both ranks alike: nothing to report
        results["extra_recompile"] = run("raise", [False, one])        # rank 1 alone recompiles at call 2
        results["differ"] = run("raise", [one])                        # compile #1 differs between the ranks
        results["differ_warn"] = run("warn", [one, one])
        results["off"] = run("off", [one])
    finally:
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.destroy_process_group()


if __name__ == "__main__":
    r, w, p, out = sys.argv[1:5]
    main(int(r), int(w), int(p), out)
