#!/bin/bash
# Issue 29, warm start on the H100 (session 37, branch s37-warmcg): a fresh process with warm caches
# reaches its first result in <= 0.3 s (imports excluded) for GPT-2 inference and training.
# What this branch changes on the warm path: auto CUDA graphs decide a cached training graph from facts
# stored with it (its nodes are no longer built: was 0.57 s of gpt2_train's 1.17 s), the aot cache key
# hashes the graph's nodes instead of generating its Python code (0.05-0.09 s), kernel modules are
# imported only when a launch needs the function (recorded binaries need none: 44 modules, 0.08 s).
# Run from the repository root on the GPU machine:
#     bash benchmarks/warm_gpu_check.sh
# What proves it:
#  * the "warm: first" lines of the first command: <= 0.300 s for gpt2_train and gpt2_infer (session 37
#    start: 1.17 s and 0.486 s), with "frames traced 0, loaded 1";
#  * on the warm lines: "aot graphs loaded unbuilt N, built 0" for gpt2_train (was 2 built: the auto
#    CUDA-graph decision), the same "auto cudagraphs" decisions on the cold and warm lines, and "native
#    modules imported" about the number of graphs (wrappers), not graphs + kernels (~46 before);
#  * in the profiled run: no cudagraphs/auto.py or aot/cache.py:rebuild_nodes / persistent_load in the
#    top cumulative list of gpt2_train (compile_auto ~ native compile_aten_graph), "aot: cache key" near
#    0.01 s; then the GPU tests pass (test_a_warm_process_runs_no_triton_jit among them).
set -x
python benchmarks/warm_profile.py --device cuda --workloads gpt2_train,gpt2_infer --no-profile
python benchmarks/warm_profile.py --device cuda --workloads gpt2_train,gpt2_infer --top 40
python -m pytest -q -p no:cacheprovider tests/aot/test_aot_deferred.py tests/native/test_warm_launch.py \
    tests/test_warm_start.py tests/cudagraphs/test_auto.py tests/aot/test_aot_cache.py tests/native/test_backend.py \
    -m "gpu or not gpu"
