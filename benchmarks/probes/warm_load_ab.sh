#!/bin/bash
# Paired A/B of a warm process's load (wall time of ember.frontend.persist.load: the frontend record,
# the graph, the backend compile from the aot and native caches; no running), session 36 (issue 29).
#   base: a checkout of the older code in $BASE with its warm caches in $BASE_CACHE (made by
#         `python benchmarks/warm_profile.py --device cpu --workloads gpt2_train,gpt2_infer --shape 1,64 --cache-dir $BASE_CACHE`
#         run from $BASE), new: this checkout and $NEW_CACHE made the same way from here.
# Each child runs under the CPU timing lock; rounds alternate base/new.
ROUNDS=${ROUNDS:-3}
WL=${WL:-gpt2_train gpt2_infer}
HERE=$(cd "$(dirname "$0")/../.." && pwd)
for r in $(seq $ROUNDS); do
  for wl in $WL; do
    for v in base new; do
      if [ $v = base ]; then root=$BASE; cache=$BASE_CACHE; else root=$HERE; cache=$NEW_CACHE; fi
      out=$(cd $root && PYTHONPATH=$root PYTHONPYCACHEPREFIX=$cache/pycache EMBER_CACHE_DIR=$cache/$wl/ember TRITON_CACHE_DIR=$cache/$wl/triton \
        flock /tmp/ember-cpu-bench.lock python $HERE/benchmarks/probes/warm_load_time.py $wl 2>&1 | grep '^LOAD')
      echo "$v $out"
    done
  done
done
