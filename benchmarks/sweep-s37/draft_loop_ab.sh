#!/bin/bash
# usage: git worktree add /tmp/before REV && BEFORE=/tmp/before bash benchmarks/sweep-s37/THIS.sh (from the repository root)
# draft-loop A/B: the same phase benchmark from the old checkout and the new one, alternating
out=$(pwd)/${OUT:-runs/measure-s37}/draft-ab; mkdir -p $out
for round in 1 2 3; do
  for rev in old new; do
    dir=$(pwd); [ $rev = old ] && dir=$BEFORE
    (cd $dir && PYTHONPATH=$dir python scripts/bench_round_phases.py --configs plain,dspark-3,default \
        --prompts 4 --max-tokens 96 --json $out/$rev-$round.json > $out/$rev-$round.txt 2>&1)
  done
done
