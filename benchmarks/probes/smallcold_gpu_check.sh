#!/bin/bash
# Issue 29, session 42 (branch s42-smallcold): where the cold first call of the one-kernel rows goes
# on the H100, and before/after in one call (paired on one machine):
#     bash benchmarks/probes/smallcold_gpu_check.sh timeline OUTDIR [REV]   # small_cold_timeline.py, 4 rows
#     bash benchmarks/probes/smallcold_gpu_check.sh ab OUTDIR BASE_REV       # compile_time, BASE_REV vs HEAD, interleaved
# (~1 min per compile_time run of the 4 rows, cold+warm; the timeline ~6 s per row). The acceptance
# numbers: python benchmarks/compile_time.py --device cuda --workloads overhead,ln_gelu,mlp,softmax \
#     --compilers ember,torch --torch-phases cold --no-import        (add --phases for ember's phase table)
STEP=${1:-timeline}
OUT_DIR=${2:-${OUT:-/tmp}}
mkdir -p "$OUT_DIR"
export PYTHONPYCACHEPREFIX=/tmp/smallcold-pyc PYTHONUNBUFFERED=1
unset PYTHONDONTWRITEBYTECODE
ROWS="overhead ln_gelu mlp softmax"
warm_bytecode() {  # (as gpu_suite.child_env: an installed package has its bytecode)
  (cd "$1" && PYTHONPATH=$PWD python -c "import torch, ember, ember.frontend.convert, ember.aot.pipeline, ember.native.backend, ember.native.runtime, ember.native.build_pool, triton.compiler, torch._dynamo, torch._inductor.compile_fx" >/dev/null 2>&1)
}
case "$STEP" in
timeline)
  warm_bytecode .
  for r in $ROWS; do PYTHONPATH=$PWD python benchmarks/probes/small_cold_timeline.py $r; done 2>&1 | tee "$OUT_DIR/timeline.txt" ;;
ab)
  BASE=${3:?base revision}
  git worktree add -f /tmp/smallcold-base "$BASE" >/dev/null 2>&1 || { rm -rf /tmp/smallcold-base; git worktree prune; git worktree add -f /tmp/smallcold-base "$BASE"; }
  warm_bytecode /tmp/smallcold-base; warm_bytecode .
  for i in 1 2; do
    for side in base head; do
      dir=$PWD; [ $side = base ] && dir=/tmp/smallcold-base
      (cd $dir && python benchmarks/compile_time.py --device cuda --workloads overhead,ln_gelu,mlp,softmax --compilers ember \
          --no-import --timeout 200 --out "$OUT_DIR/ct-$side-$i.json" 2>&1 | grep -v "^$" | tail -n 12)
    done
  done ;;
esac
