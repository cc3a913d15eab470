#!/bin/bash
# Issue 29, session 40 (branch s40-warm): GPT-2's warm start on the H100 (target: warm compile_s <= 0.3 s;
# s39 on the H100: gpt2_train 0.558 s). One device command, ~4-5 min (each step has its own timeout):
#     bash benchmarks/probes/warm_s40_gpu_check.sh OUTDIR
# 0. the GPU tests of the warm launch path: a warm process adopts every recorded kernel (no Triton JIT),
#    now from a packed launch record with stored fast-path factories; the sites' generated functions
#    on the real launcher. Expect "2 passed".
# 1. compile_time gpt2_infer and gpt2_train, ember, cold then warm: the warm rows' compile_s are the
#    numbers (OUTDIR/compile_time-h100-s40-warm.json; the table is printed; warm_launch adopted 377, jit 0).
# 2. warm_profile gpt2_train: cProfile of the warm first call (OUTDIR/warm_profile-gpt2-train-h100-s40.txt):
#    no simplify_attention_masks, no ~0.3 s of hashlib update (triton_key no longer runs on a warm start),
#    no 33 builtins.compile (the launch sites' fast-path factories come stored), ~no builtins.eval.
# 3. compile_time gpt2_train with --phases: wall seconds of the warm phases without cProfile
#    (OUTDIR/compile_time-h100-s40-warm-phases.json, printed).
OUT_DIR=${1:-${OUT:-/tmp}}
mkdir -p "$OUT_DIR"
set -x
timeout 75 python -m pytest -q -p no:cacheprovider -m gpu tests/native/test_warm_launch.py \
    tests/native/test_launch_run.py -k "no_triton_jit or generated_function" 2>&1 | tail -n 15
timeout 170 python benchmarks/compile_time.py --device cuda --workloads gpt2_infer,gpt2_train --compilers ember \
    --no-import --timeout 150 --out "$OUT_DIR/compile_time-h100-s40-warm.json"
timeout 150 python benchmarks/warm_profile.py --device cuda --workloads gpt2_train --top 30 --timeout 130 \
    > "$OUT_DIR/warm_profile-gpt2-train-h100-s40.txt" 2>&1
grep -v "modules first imported" "$OUT_DIR/warm_profile-gpt2-train-h100-s40.txt" | tail -n 90
timeout 90 python benchmarks/compile_time.py --device cuda --workloads gpt2_train --compilers ember --no-import \
    --phases --timeout 80 --out "$OUT_DIR/compile_time-h100-s40-warm-phases.json"
python - "$OUT_DIR/compile_time-h100-s40-warm-phases.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(r.get("row"), r.get("phase"), r.get("compile_s"), "warm_launch", r.get("warm_launch"), "gc", r.get("gc"))
    for k, v in sorted((r.get("phases") or {}).items(), key=lambda kv: -kv[1][0]):
        print(f"    {k:<36} {v[0]:8.3f} s  x{v[1]}")
PY
