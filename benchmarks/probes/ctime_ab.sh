#!/bin/bash
# Issue 29, session 39: paired cold-compile A/B on CPU, base tree vs this tree, interleaved rounds of
# benchmarks/probes/llama_cold.py (24-layer Llama at tiny widths, Triton source rendered, empty caches).
#     ROUNDS=3 MODE="--triton --train" BASE=/work/main bash benchmarks/probes/ctime_ab.sh
# Prints each run's first-call wall and main-thread CPU seconds and the gen2 (full) gc; compare the
# CPU column on a shared machine (walls wait for other processes).
ROUNDS=${ROUNDS:-3}
MODE=${MODE:---triton --train}
BASE=${BASE:-/work/main}
NEW=${NEW:-$PWD}
PROBE=$NEW/benchmarks/probes/llama_cold.py
for r in $(seq "$ROUNDS"); do  # (one lock per pair: each locked command stays short)
  for side in base new; do
    tree=$BASE; [ "$side" = new ] && tree=$NEW
    line=$(cd "$tree" && PYTHONPATH=$tree ${LOCK:-flock /tmp/ember-cpu-bench.lock} python "$PROBE" $MODE 2>/dev/null | grep -E "first call|gc during" | tr '\n' ' ')
    echo "$side $line" | sed -E 's/\{.graphs.*\}; //'
  done
done
