#!/bin/sh
# the rows of benchmarks/regional_compile.py, each in a fresh process (run from the repository root)
row() { PYTHONPATH=$PWD python benchmarks/regional_compile.py --steady 3 "$@" 2>&1 | tail -1; }
for L in 12 24; do
  for off in --off ""; do
    row --layers $L --backend ember $off
    row --layers $L --backend ember $off --train
    row --layers $L --backend aot_eager $off --train
    row --layers $L --backend eager $off
  done
done
