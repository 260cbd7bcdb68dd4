#!/bin/sh
# Engine alone, configurations stepped in turn (scripts/bench_lockstep.py): the default
# against plain decoding and against DSpark alone under the same governor, at 1, 4 and
# 32 requests in flight (16: lockstep_c16.json, with the default held in plain mode).
# 2-core AVX2-only AMD EPYC (family 25; avx2, fma, f16c; no avx512):
# benchmarks/avx2-s43/lscpu.txt.
#   sh benchmarks/avx2-s43/lockstep.sh        (writes runs/measure-s43/lockstep_c*.json)
cd "$(dirname "$0")/../.."
for c in 4 32 1; do
  n=64; [ $c = 1 ] && n=16
  python3 scripts/bench_lockstep.py --configs plain,default,dspark --concurrency $c --num-prompts $n \
    --max-tokens 96 --repeats 3 --json runs/measure-s43/lockstep_c$c.json
done
