#!/usr/bin/env bash
# Issue 27 on one H100 (about 3-5 minutes): CUDA AOT packages with a dynamic batch hold ember's Triton
# kernels (symbolic sizes, no per-size fallback), load them straight from their binaries in a fresh
# process (Triton's compiler patched to raise, no JIT run) and match eager at 4 batch sizes; then
# GPT-2 (124M) start-up: import / load / first call, and the floor of moving the weights.
#
#   bash benchmarks/export_gpu_check.sh 2>&1 | tee /tmp/export_gpu_check.log
#
# What proves each point:
#   * "4 passed" from test_aot_gpu.py (tiny ResNet, GPT-2, ResNet-50 packages; new batch sizes reuse kernels; "3 passed, 1 skipped" without torchvision), each child line "cuda aot ok import .. load .. first ..
#     batches 4 kernels {'renderer': 'triton', 'kernels_loaded': N, 'kernels_jit': 0, ...} jit_runs 0"
#   * startup.py's line "ember:aot load + first call beyond moving the weights: X s" with X <= 0.5
#     (and kernels from binaries N, through Triton's JIT 0), written to
#     benchmarks/results/startup-h100-gpt2-aot.json
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 300 python -m pytest -q -p no:cacheprovider tests/export/test_aot_gpu.py -m gpu -s -x 2>&1 | grep -E "cuda aot ok|passed|failed|Error|assert" | head -40
timeout 300 python benchmarks/startup.py --model gpt2 --size full --device cuda --iters 20 \
    --variants weights,ember:aot --out benchmarks/results/startup-h100-gpt2-aot.json
