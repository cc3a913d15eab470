#!/bin/bash
# Session 39 (branch s39-fuzz): the OpInfo differential sweep on the GPU: op_db samples, module_db and the
# square-shape patterns through ember.compile on CUDA tensors (the native backend's Triton kernels, not
# the interpreter), against eager. ~6-8 min in all (each part has its own deadline).
#     bash benchmarks/probes/opinfo_gpu_check.sh OUTDIR        (from the repository root)
# What proves it: each summary's "counts" has no "mismatch", "crash" or "timeout" (the lines printed after
# each summary list any, with op, dtype, mode, sample and the first differing element); "noise" entries
# are within 3x eager's own distance from a float64 reference; "error" lines are ember exceptions where
# eager worked (crashes to list, not wrong numbers). Needs no network; expecttest is stubbed if absent.
OUT_DIR=${1:-${OUT:-/tmp}}
mkdir -p "$OUT_DIR"
set -x
python benchmarks/probes/opinfo_sweep.py --device cuda --modes infer,train,nc,out --max-samples 2 --deadline 240 \
    --out "$OUT_DIR/opinfo_sweep-cuda-ops.json" 2>&1 | grep -v Warning | tail -n 60
# the op families this branch fixed or the CPU sweep flagged, whatever the deadline above reached
python benchmarks/probes/opinfo_sweep.py --device cuda --dtypes float32,bfloat16 --modes infer,train,out --deadline 150 \
    --ops '^(split_with_sizes_copy|unbind_copy|linalg\.(inv|solve|cholesky|matrix_rank|lu_factor|eigvals)|max\.reduction_with_dim|topk|sort|cummax|aminmax|kthvalue|stft|masked\.norm|_batch_norm_with_update|native_batch_norm|nn\.functional\.(cross_entropy|layer_norm|rms_norm|group_norm|batch_norm))$' \
    --out "$OUT_DIR/opinfo_sweep-cuda-flagged.json" 2>&1 | grep -v Warning | tail -n 40
python benchmarks/probes/opinfo_sweep.py --device cuda --suite patterns --dtypes float32,bfloat16 --deadline 100 \
    --out "$OUT_DIR/opinfo_sweep-cuda-patterns.json" 2>&1 | grep -v Warning | tail -n 30
python benchmarks/probes/opinfo_sweep.py --device cuda --suite modules --max-samples 2 --deadline 100 \
    --out "$OUT_DIR/opinfo_sweep-cuda-modules.json" 2>&1 | grep -v Warning | tail -n 30
