#!/bin/sh
# Engine alone, configurations stepped in turn (scripts/bench_lockstep.py): the default
# against plain decoding and DSpark alone at 1, 4, 16 and 32 requests in flight.
# 2-core AMD EPYC with avx512_bf16, no AMX: benchmarks/avx512bf16-s44/lscpu.txt.
#   sh benchmarks/avx512bf16-s44/lockstep.sh        (writes runs/measure-s44/lockstep_c*.json)
cd "$(dirname "$0")/../.."
for c in 1 4 16 32; do
  n=64; [ $c = 1 ] && n=16
  python3 scripts/bench_lockstep.py --configs plain,default,dspark --concurrency $c --num-prompts $n \
    --max-tokens 96 --repeats 3 --json runs/measure-s44/lockstep_c$c.json
done
