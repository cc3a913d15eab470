#!/usr/bin/env bash
# Session 40 (helper llama, issue 29): cold compile of compile_time.py's 1.2B Llama rows with the
# fusion cap (ember.config.native_max_fused_buffers, default 32), and a paired A/B of the cap against
# no cap (0: session 39's fusion) in one call: build timelines, first-result time, steady step time.
# ~4-5 minutes on the H100.
#
#   bash benchmarks/probes/llama_s40_gpu_check.sh OUTDIR          # AB_COMPILE_TIME=1: also compile_time.py at cap 0
#
# What proves the change: in OUTDIR/bt-llama_train-cap32.txt the slowest build is well under the cap-0
# run's (~4.9 s: triton_red_fused_embedding_add_to_copy_rsqrt_mul_view_1, 151 buffers) and the
# backward's first-launch wait shrinks (cap 0: ~3.1 s); first result earlier by about that much;
# steady step (median of 20) equal within noise. compile_time-llama-s40.json: the acceptance rows.
set -u
OUT=${1:?usage: llama_s40_gpu_check.sh OUTDIR}
mkdir -p "$OUT/bt"
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1
echo "== compile_time.py (default: fusion cap 32)"
python benchmarks/compile_time.py --device cuda --workloads llama_infer,llama_train --compilers ember --no-import \
    --timeout 200 --out "$OUT/compile_time-llama-s40.json" 2>&1 | tail -n 12
echo "== paired cold timelines: cap 32 (default) vs cap 0 (session 39's fusion), one fresh process each"
# bytecode cached first, as compile_time.py does (the H100 machine sets PYTHONDONTWRITEBYTECODE: modules
# imported during a compile would otherwise compile from source inside the timed first call)
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/llama_s40_pycache
python -m compileall -q -j 8 ember benchmarks > /dev/null 2>&1
python -c "import sys, importlib; sys.path.insert(0, 'benchmarks'); import gpu_suite
for m in gpu_suite.WARM_IMPORTS:
    try: importlib.import_module(m)
    except ImportError: pass" > /dev/null 2>&1
for row in llama_train llama_infer; do
  caps="32 0"; [ "$row" = llama_infer ] && caps="0 32"  # (alternating which arm runs first)
  for cap in $caps; do
    EMBER_NATIVE_MAX_FUSED_BUFFERS=$cap timeout 150 python benchmarks/probes/buildtimes.py "$row" "$OUT/bt" \
        --label "cap$cap" --steps 20 > "$OUT/bt-$row-cap$cap.txt" 2>&1
    echo "rc=$? $row cap $cap"
    grep -v "torchao\|_pytree\|Enum subclass" "$OUT/bt-$row-cap$cap.txt" | head -n 40
  done
done
if [ "${AB_COMPILE_TIME:-0}" = "1" ]; then
  echo "== compile_time.py at cap 0"
  EMBER_NATIVE_MAX_FUSED_BUFFERS=0 python benchmarks/compile_time.py --device cuda --workloads llama_infer,llama_train \
      --compilers ember --no-import --timeout 200 --out "$OUT/compile_time-llama-s40-cap0.json" 2>&1 | tail -n 12
fi
