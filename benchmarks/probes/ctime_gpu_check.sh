#!/bin/bash
# Issue 29, session 38 (branch s38-ctime): compile time on the H100, ember only, ~4-5 min.
#     bash benchmarks/probes/ctime_gpu_check.sh OUTDIR        (from the repository root; OUTDIR: where the files go)
# 1. compile_time rows gpt2_train (warm start: target <= 0.3 s, was 0.342 s in s37), llama_infer and
#    llama_train (cold: targets <= 4.3 s and <= 9.4 s = 1/5 of torch.compile's s35 21.65 s / 47.0 s; were
#    5.41 s / 11.23 s in s37). Each row now also says the full GC collections inside compile_s ("full gc
#    xN s"), aot/native cache hits, kernels adopted from recorded binaries vs Triton's JIT, the build
#    pool's wait and the auto CUDA-graph decisions (JSON).
# 2. the same llama_train row with --phases: wall seconds of each compile phase (frontend trace, aot
#    trace_joint/partition/cache store, native lower/schedule/emit, wait for kernel builds) -> where the
#    cold 11 s go on the GPU host (compile_s of this run leaves the phase modules' import out).
# 3. warm_profile of gpt2_train: the warm first call under cProfile (spans: frontend/aot/native loads,
#    adopted kernels, first backward, optimizer step; top ember functions) -> what is left of 0.3 s.
# What proves it: the first table's ember cold s of llama_infer/llama_train and warm s of gpt2_train,
# every row "ok" with err as before (llama_infer err ~3e-2, gpt2 rows ~1e-2).
OUT_DIR=${1:-${OUT:-/tmp}}
mkdir -p "$OUT_DIR"
set -x
python benchmarks/compile_time.py --device cuda --workloads gpt2_train,llama_infer,llama_train --compilers ember \
    --no-import --timeout 200 --out "$OUT_DIR/compile_time-h100-s38-ctime.json"
python benchmarks/compile_time.py --device cuda --workloads llama_train --compilers ember --no-import --phases \
    --timeout 200 --out "$OUT_DIR/compile_time-h100-s38-ctime-phases.json"
python benchmarks/warm_profile.py --device cuda --workloads gpt2_train --top 30 --timeout 200 \
    > "$OUT_DIR/warm_profile-gpt2-train-h100-s38.txt" 2>&1
tail -n 80 "$OUT_DIR/warm_profile-gpt2-train-h100-s38.txt"
python - "$OUT_DIR/compile_time-h100-s38-ctime-phases.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(r.get("row"), r.get("phase"), r.get("compile_s"), "gc", r.get("gc"))
    for k, v in sorted((r.get("phases") or {}).items(), key=lambda kv: -kv[1][0]):
        print(f"    {k:<36} {v[0]:8.3f} s  x{v[1]}")
PY
