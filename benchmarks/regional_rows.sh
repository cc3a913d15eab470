#!/bin/sh
# every row of benchmarks/regional_compile.py, each in a fresh process (run from the repository root)
for mode in "" --train; do
  for be in ember aot_eager eager; do
    for L in 12 24; do
      for off in --off ""; do
        PYTHONPATH=$PWD python benchmarks/regional_compile.py --layers $L --backend $be $off $mode 2>&1 | tail -1
      done
    done
  done
done
