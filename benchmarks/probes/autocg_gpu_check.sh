#!/usr/bin/env bash
# Issue 28 (branch s38-autocg): measured automatic CUDA graphs for inference graphs. One H100 section
# per call, each under 10 minutes, from the repository root:
#     bash benchmarks/probes/autocg_gpu_check.sh 1     # tests + kernel profiles      (~4 min)
#     bash benchmarks/probes/autocg_gpu_check.sh 2     # gpu_suite subset             (~9 min)
#     bash benchmarks/probes/autocg_gpu_check.sh 3     # replay host cost, cold/warm  (~2 min)
# Writes under ${OUT:-/tmp/autocg_gpu_check}.
#  1. the gpu-marked tests of tests/cudagraphs (expect all pass; test_measure's says "measured
#     host-bound"), then kernel_profile for bert_infer and resnet50_infer under ember. Expect for
#     bert_infer: a "cuda graphs:" block whose decision reads "replays: measured host-bound: host ~4000 us,
#     device ~1700 us", replays > 0, and "cpu-side" per call far below the 3.98 ms of
#     /work/wt/profiles/bert_infer-ember.txt (a replay issues in microseconds) with wall ~ device time.
#  2. gpu_suite bert_infer, resnet50_infer, vit_infer, mlp, tiny_hf x eager, ember, ember-warm (--jobs 1).
#     Expect bert_infer ember ~1.8-2 ms (was ~3.7), ember_cudagraph_decisions and
#     ember_warm_cudagraph_decisions equal in replayed? per graph, outputs checked ("ember_check": ok).
#  3. benchmarks/probes/replay_host_cost.py on tiny_hf: cold and two warm processes, 500-call loops.
set -u
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/autocg_gpu_check}
mkdir -p "$OUT"
T0=$(date +%s)
say() { echo "[autocg +$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/[gpu] /'
case "${1:-1}" in
1)
  say "1a. gpu tests of tests/cudagraphs"
  timeout 200 python -m pytest -q -p no:cacheprovider tests/cudagraphs -m gpu 2>&1 | tail -n 15
  for wl in bert_infer resnet50_infer; do
    say "1b. kernel_profile $wl ember"
    timeout 150 python benchmarks/kernel_profile.py $wl ember --top 8 > "$OUT/profile_$wl.txt" 2>&1
    say "  rc=$?"; grep -v Warning "$OUT/profile_$wl.txt" | grep -v _warn_once | head -n 30
  done
  ;;
2)
  say "2. gpu_suite subset"
  timeout 590 python benchmarks/gpu_suite.py --workloads bert_infer,resnet50_infer,vit_infer,mlp,tiny_hf \
    --compilers eager,ember,ember-warm --jobs 1 --no-peaks --budget 570 --out "$OUT/gpu_suite_autocg.json" \
    > "$OUT/gpu_suite.txt" 2>&1
  say "  rc=$?"; tail -n 20 "$OUT/gpu_suite.txt"
  python - "$OUT/gpu_suite_autocg.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    print(r["workload"], "eager", r.get("eager_ms"), "ember", r.get("ember_ms"), "warm", r.get("ember_warm_ms"),
          "check", r.get("ember_check"))
    for k in ("ember_cudagraph_decisions", "ember_warm_cudagraph_decisions"):
        for name, replay, why in r.get(k) or []:
            print(f"   {k[:-len('_cudagraph_decisions')]:10s} {name}: {'replay' if replay else 'no'}: {why[:150]}")
EOF
  ;;
3)
  say "3. replay host cost, tiny_hf cold / warm1 / warm2"
  timeout 500 python benchmarks/probes/replay_host_cost.py --workload tiny_hf --calls 500 --warm 2 \
    --out "$OUT/replay_host_cost.json" 2>&1 | tail -n 70
  say "  rc=$?"
  ;;
esac
say "done"
