#!/bin/bash
# Issue 29, cold compile of the whole-model 1B Llama (session 37, branch s37-ctime): lazy fx code,
# inference graphs analyzed inside their one trace, memoized index simplification, cheaper fusion
# checks, no full GC collection while compiling, build workers started before the aot trace. Run
# from the repository root on the H100, $OUT set (the first command ~7 min, then ~5 min, then ~3):
#     bash benchmarks/probes/ctime_gpu_check.sh
# What proves it: the summary table's "cold ratio" of llama_infer (was 0.31-0.33, target <= 0.2) and
# llama_train (was 0.36, target <= 0.2), gpt2_infer/gpt2_train cold ratio <= 0.33 (were 0.32-0.35),
# every ember row "ok" with err as before. Then the profiled first calls (phases, build waits) say
# where the rest goes: "native: wait for kernel builds" vs the Python phases.
set -x
python benchmarks/compile_time.py --device cuda --workloads llama_infer,llama_train,gpt2_infer,gpt2_train \
    --torch-phases cold --no-import --timeout 200 --out ${OUT:-/tmp}/compile_time-h100-s37-ctime.json
python benchmarks/compile_profile.py --device cuda --workload llama_infer --regional off --out ${OUT:-/tmp}/profile-llama-infer.json
python benchmarks/compile_profile.py --device cuda --workload llama_train --regional off --out ${OUT:-/tmp}/profile-llama-train.json
python -m pytest -q -p no:cacheprovider tests/aot tests/cudagraphs tests/native/test_build_pool.py \
    tests/native/test_warm_start.py tests/test_warm_start.py -m gpu
