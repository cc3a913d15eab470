#!/bin/bash
# Issue 29, warm start on the H100 (session 36, branch s36-warmtrain): what the deferred aot graphs,
# the lazy frontend code check, auto cudagraphs' report-only decision and warm_launch's per-binary
# adoption change. Run from the repository root on the GPU machine:
#     bash benchmarks/warm_gpu_check.sh
# What proves it: the "warm: first" lines of the first two commands (target <= 0.3 s for gpt2_infer
# and gpt2_train; last session 0.197-0.314 s and 0.718 s), "frames traced 0, loaded 1" on them, and
# in the profiled run "aot: load" (was 0.49 s for gpt2_train) and "aot: rebuild graph" (was 0.34 s)
# near 0; then the GPU tests pass.
set -x
python benchmarks/warm_profile.py --device cuda --workloads gpt2_train,gpt2_infer --no-profile
python benchmarks/warm_profile.py --device cuda --workloads gpt2_train,gpt2_infer --top 30
python -m pytest -q -p no:cacheprovider tests/aot/test_aot_deferred.py tests/native/test_warm_launch.py \
    tests/test_warm_start.py tests/cudagraphs/test_auto.py tests/aot/test_aot_cache.py -m "gpu or not gpu"
