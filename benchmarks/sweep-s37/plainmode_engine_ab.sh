#!/bin/bash
# usage: git worktree add /tmp/before REV && BEFORE=/tmp/before bash benchmarks/sweep-s37/THIS.sh (from the repository root)
out=$(pwd)/${OUT:-runs/measure-s37}/plainmode-ab; mkdir -p $out
for c in 16 32; do
for round in 1 2; do
  for rev in old new; do
    dir=$(pwd); [ $rev = old ] && dir=$BEFORE
    (cd $dir && PYTHONPATH=$dir python scripts/bench_round_phases.py --configs plain,default \
        --concurrency $c --prompts 2 --max-tokens 64 --json $out/$rev-c$c-$round.json 2>&1 | grep -E "^(plain|default) " > $out/$rev-c$c-$round.txt)
  done
done
done
