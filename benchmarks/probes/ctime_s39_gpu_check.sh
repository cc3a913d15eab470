#!/bin/bash
# Issue 29, session 39 (branch s39-ctime): compile time on the H100, ember only. One step per call
# (each fits a 10-minute device command):
#     bash benchmarks/probes/ctime_s39_gpu_check.sh rows   OUTDIR   # ~5-6 min: the acceptance rows
#     bash benchmarks/probes/ctime_s39_gpu_check.sh warm   OUTDIR   # ~2 min: where GPT-2 training's warm start goes
#     bash benchmarks/probes/ctime_s39_gpu_check.sh phases OUTDIR   # ~2 min: llama_train's cold compile by phase
# rows: compile_time gpt2_train (warm target <= 0.3 s; s38: 0.478 s), llama_infer and llama_train
#   (cold targets <= 4.3 s / <= 9.4 s, 1/5 of torch.compile's 21.65 / 47.0 s; s37: 5.41 / 11.23 s,
#   s38 on a slower host: 8.08 / 19.39 s). Each row also says "full gc xN s": with this branch the
#   compile's full collection walks only the compile's own objects.
# warm: warm_profile of gpt2_train (cProfile of the warm first call: frontend/aot/native loads, adopted
#   kernels, first backward, optimizer step) -- the s38 run timed out before reaching it.
# phases: llama_train with --phases (aot: trace_joint_analyzed should show and analysis.collect not).
STEP=${1:-rows}
OUT_DIR=${2:-${OUT:-/tmp}}
mkdir -p "$OUT_DIR"
set -x
case "$STEP" in
rows)
  python benchmarks/compile_time.py --device cuda --workloads gpt2_train,llama_infer,llama_train --compilers ember \
      --no-import --timeout 200 --out "$OUT_DIR/compile_time-h100-s39-ctime.json" ;;
warm)
  python benchmarks/warm_profile.py --device cuda --workloads gpt2_train --top 40 --timeout 300 \
      > "$OUT_DIR/warm_profile-gpt2-train-h100-s39.txt" 2>&1
  tail -n 120 "$OUT_DIR/warm_profile-gpt2-train-h100-s39.txt" ;;
phases)
  python benchmarks/compile_time.py --device cuda --workloads llama_train --compilers ember --no-import --phases \
      --timeout 300 --out "$OUT_DIR/compile_time-h100-s39-ctime-phases.json"
  python - "$OUT_DIR/compile_time-h100-s39-ctime-phases.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(r.get("row"), r.get("phase"), r.get("compile_s"), "gc", r.get("gc"))
    for k, v in sorted((r.get("phases") or {}).items(), key=lambda kv: -kv[1][0]):
        print(f"    {k:<36} {v[0]:8.3f} s  x{v[1]}")
PY
  ;;
esac
