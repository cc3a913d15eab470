#!/usr/bin/env bash
# Issue 28, host cost per launch (branch s36-launch): one H100 run, under 8 minutes. From the
# repository root:
#     bash benchmarks/probes/launch_gpu_check.sh
#  1. the launch path's GPU tests (real Triton launcher: generated site.run, tensors passed as
#     addresses, a misaligned input, another stream). Expect: all passed.
#  2. launch_breakdown.py: host us per call of each layer of the overhead row, and the whole call
#     with tensors instead of addresses (RAW_POINTERS=False). Expect "ember" below "eager", and
#     "launch(addresses)" below "launch(tensors)" (else set runtime.RAW_POINTERS = False).
#  3. launch_path.py: frames and C calls per call (overhead, mlp with and without grad).
#  4. gpu_suite on overhead, mlp, tiny_hf: eager / ember / torch.compile in one run. Expect
#     ember >= 1.10x eager on overhead and mlp.
set -u
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
T0=$(date +%s)
say() { echo "[launch +$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sed 's/^/[gpu] /'

say "1. GPU tests of the launch path"
timeout 240 python -m pytest -q -p no:cacheprovider tests/native/test_launch.py tests/native/test_launch_run.py \
  -m gpu 2>&1 | tail -n 5

say "2. per-layer host time of the overhead row"
timeout 120 python benchmarks/probes/launch_breakdown.py benchmarks/results/launch-breakdown-h100.json 2>&1 | tail -n 40

say "3. frames and time per call"
timeout 120 python benchmarks/probes/launch_path.py 2>&1 | tail -n 5

say "4. gpu_suite overhead, mlp, tiny_hf"
timeout 420 python benchmarks/gpu_suite.py --workloads overhead,mlp,tiny_hf --compilers eager,ember,torch --jobs 1 \
  --no-peaks --out benchmarks/results/quick/gpu_suite-launch-check.json 2>&1 | tail -n 25
say "done"
