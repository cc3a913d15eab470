"""Paired, interleaved cold first calls of two ember trees (e.g. before/after a change to the
decomposition tables), as ``compile_time.py`` measures them: each run one fresh process
(``compile_time.py --child ROW ember``: imports first, eager once, then wrap + first call timed) with
an empty cache directory, the two trees alternating (which goes first alternates too):

    flock /tmp/ember-cpu-bench.lock python benchmarks/probes/decomp_cold_pair.py /tmp/base $PWD \\
        --rows overhead,softmax,ln_gelu,mlp --reps 5 [--aten] [--device cpu] [--quick]

``--aten``: EMBER_NATIVE_CPU=aten (the autograd layer's CPU path: eager's kernels, no C++ builds).
Prints each run's compile_s, then per row and tree the median and the median of the paired differences.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile


def run(tree: str, row: str, args, pycache: str) -> float:
    cache = tempfile.mkdtemp(prefix="decomp_pair_")
    env = dict(os.environ, PYTHONPATH=tree, EMBER_CACHE_DIR=cache, PYTHONPYCACHEPREFIX=pycache)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if args.aten:
        env["EMBER_NATIVE_CPU"] = "aten"
    cmd = [sys.executable, os.path.join(tree, "benchmarks", "compile_time.py"), "--child", row, "ember",
           "--device", args.device] + (["--quick"] if args.quick else [])
    try:
        p = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True, timeout=600)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"{tree} {row} failed:\n{p.stderr[-3000:]}")
    return json.loads(line[7:])["compile_s"]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("base")
    p.add_argument("new")
    p.add_argument("--rows", default="overhead,softmax,ln_gelu,mlp")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--device", default="cpu")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--aten", action="store_true")
    a = p.parse_args()
    trees = {"base": os.path.abspath(a.base), "new": os.path.abspath(a.new)}
    pycache = {k: tempfile.mkdtemp(prefix=f"decomp_pair_pyc_{k}_") for k in trees}
    got = {(row, k): [] for row in a.rows.split(",") for k in trees}
    for k, tree in trees.items():  # bytecode cached first, as an installed package has it
        run(tree, a.rows.split(",")[0], a, pycache[k])
    for rep in range(a.reps):
        for row in a.rows.split(","):
            order = ["base", "new"] if rep % 2 == 0 else ["new", "base"]
            for k in order:
                got[(row, k)].append(run(trees[k], row, a, pycache[k]))
            b, n = got[(row, "base")][-1], got[(row, "new")][-1]
            print(f"rep {rep} {row:<9} base {b:.3f} s  new {n:.3f} s", flush=True)
    for row in a.rows.split(","):
        b, n = got[(row, "base")], got[(row, "new")]
        diff = statistics.median(x - y for x, y in zip(b, n))
        print(f"{row:<9} median base {statistics.median(b):.3f} s  new {statistics.median(n):.3f} s  "
              f"paired base-new median {diff:+.3f} s  (n={len(b)})")
    for d in pycache.values():
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
