#!/usr/bin/env bash
# Session 40 (helper llama, issue 29): cold compile of compile_time.py's 1.2B Llama rows with
# session 40's kernel changes (the fusion cap, ember.config.native_max_fused_buffers = 32, and small
# libdevice values stored once, lowering.GraphLowering.REALIZE_LIBDEVICE_NUMEL), and a paired A/B
# against session 39's kernels (buildtimes.py --s39-fusion) in one call: build timelines, first
# result, steady step time, a sampled profile of the main thread. ~5 minutes on the H100.
#
#   bash benchmarks/probes/llama_s40_gpu_check.sh OUTDIR      # AB_COMPILE_TIME=1: + compile_time.py at cap 0
#   SKIP_COMPILE_TIME=1 bash benchmarks/probes/llama_s40_gpu_check.sh OUTDIR   # the A/B timelines only (~2.5 min)
#
# What proves the change: OUTDIR/bt-llama_train-new.txt's slowest build far under the s39 arm's
# (~4.9 s: triton_red_fused_embedding_add_to_copy_rsqrt_mul_view_1, 151 buffers) and its backward's
# first-launch wait gone (s39: ~3.1 s); llama_infer's slowest build ~2.0 s -> under 1 s and its wait
# (~1.7 s) shorter; first result earlier by about those amounts; steady step (median of 20) equal
# within noise. compile_time-llama-s40.json: the acceptance rows (compile_s, build_pool stats).
set -u
OUT=${1:?usage: llama_s40_gpu_check.sh OUTDIR}
mkdir -p "$OUT/bt"
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1
if [ "${SKIP_COMPILE_TIME:-0}" != "1" ]; then
  echo "== compile_time.py (session 40 defaults)"
  python benchmarks/compile_time.py --device cuda --workloads llama_infer,llama_train --compilers ember --no-import \
      --timeout 200 --out "$OUT/compile_time-llama-s40.json" 2>&1 | tail -n 12
fi
echo "== paired cold timelines: new (defaults) vs s39 (--s39-fusion), one fresh process each"
# bytecode cached first, as compile_time.py does (the H100 machine sets PYTHONDONTWRITEBYTECODE: modules
# imported during a compile would otherwise compile from source inside the timed first call)
unset PYTHONDONTWRITEBYTECODE
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # (this tree's ember, not an installed one)
export PYTHONPYCACHEPREFIX=/tmp/llama_s40_pycache
python -m compileall -q -j 8 ember benchmarks > /dev/null 2>&1
python -c "import sys, importlib; sys.path.insert(0, 'benchmarks'); import gpu_suite
for m in gpu_suite.WARM_IMPORTS:
    try: importlib.import_module(m)
    except ImportError: pass" > /dev/null 2>&1
for row in llama_train llama_infer; do
  arms="new s39"; [ "$row" = llama_infer ] && arms="s39 new"  # (alternating which arm runs first)
  for arm in $arms; do
    flag=""; [ "$arm" = s39 ] && flag="--s39-fusion"
    timeout 150 python benchmarks/probes/buildtimes.py "$row" "$OUT/bt" --label "$arm" --steps 20 --eager-first $flag \
        > "$OUT/bt-$row-$arm.txt" 2>&1
    echo "rc=$? $row $arm"
    grep -v "torchao\|_pytree\|Enum subclass" "$OUT/bt-$row-$arm.txt" | head -n 30
  done
done
if [ "${AB_COMPILE_TIME:-0}" = "1" ]; then
  echo "== compile_time.py at cap 0 (the fusion cap off; libdevice values still stored once)"
  EMBER_NATIVE_MAX_FUSED_BUFFERS=0 python benchmarks/compile_time.py --device cuda --workloads llama_infer,llama_train \
      --compilers ember --no-import --timeout 200 --out "$OUT/compile_time-llama-s40-cap0.json" 2>&1 | tail -n 12
fi
