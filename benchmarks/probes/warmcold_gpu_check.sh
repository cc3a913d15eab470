#!/usr/bin/env bash
# Issue 28 (branch s39-warmcold): a warm-cache process's steady time against the compiling process's.
# One H100 section per call, each under 10 minutes, from the repository root:
#     bash benchmarks/probes/warmcold_gpu_check.sh 1   # gpu tests + warm_cold on 4 rows, 2 rounds (~6 min)
#     bash benchmarks/probes/warmcold_gpu_check.sh 2   # warm_cold, every process on one CPU (~4 min)
#     bash benchmarks/probes/warmcold_gpu_check.sh 3   # warm_cold with gc.collect() after the first call (~4 min)
# Writes under ${OUT:-/tmp/warmcold_gpu_check}.
#  1. tests/cudagraphs/test_stored.py -m gpu: two real processes on one cache, the second logs
#     "reused measured decision" (expect 1 passed). Then warm_cold.py: per row and round, a cold and
#     two warm processes. Success: every "== row" line has ok True (warm/cold 0.97-1.03 raw, same
#     chain, same decisions, measured_reused True: resnet50_infer's warm decisions read "reused
#     measured decision"). Where a ratio is outside but warm_vs_cold_norm (calibrated by a fixed
#     Python loop timed in the same process) is inside, and two warm processes of one cache differ as
#     much, the difference is the host's, not ember's path: look at "cpu use" (main thread < 1: it
#     blocked or was preempted; process > thread: another thread ran), "cpus" vs the GPU's local
#     CPUs, "threads first/steady" (an ember-* thread alive in steady state), "idle-gpu X vs Y" (the
#     call alone on an idle GPU vs back to back: Y > X means the host waits on the device).
#  2. the same rows with every process pinned to CPU 2 (--pin 2): with placement fixed, cold and warm
#     should agree within 3% where section 1 did not.
#  3. the same rows, every process doing gc.collect() right after its first call (--collect-first): the
#     cold process's first full collection of its compile heap (100-200 ms on the H100: the first loop
#     of gpu_suite's overhead row, 1.11 ms/call in s38-b) then falls outside the loops. If the cold
#     rows agree within 3% here and not in section 1, the collection and its aftermath are the cause.
set -u
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/warmcold_gpu_check}
mkdir -p "$OUT"
case "${1:-1}" in
1)
    python -m pytest -q -p no:cacheprovider tests/cudagraphs/test_stored.py -m gpu 2>&1 | tail -5
    python benchmarks/probes/warm_cold.py --device cuda --workloads overhead,mlp,tiny_hf,resnet50_infer \
        --rounds 2 --warm 2 --out "$OUT/warm_cold-h100.json" 2>&1 | tee "$OUT/warm_cold-h100.txt"
    ;;
2)
    python benchmarks/probes/warm_cold.py --device cuda --workloads overhead,mlp,tiny_hf \
        --rounds 2 --warm 1 --pin 2 --out "$OUT/warm_cold-h100-pinned.json" 2>&1 | tee "$OUT/warm_cold-h100-pinned.txt"
    ;;
3)
    python benchmarks/probes/warm_cold.py --device cuda --workloads overhead,mlp,tiny_hf \
        --rounds 2 --warm 1 --collect-first --out "$OUT/warm_cold-h100-collect.json" 2>&1 | tee "$OUT/warm_cold-h100-collect.txt"
    ;;
esac
