#!/bin/sh
# Engine alone, configurations stepped in turn (scripts/bench_lockstep.py): the default and
# the default held in plain mode against plain decoding at 16 and 32 requests in flight.
# 2-core AMD EPYC with avx512_bf16, no AMX: benchmarks/avx512bf16-s45/lscpu.txt.
#   sh benchmarks/avx512bf16-s45/lockstep.sh > benchmarks/avx512bf16-s45/lockstep.log
cd "$(dirname "$0")/../.."
for c in ${CONC:-16 32}; do
  python3 scripts/bench_lockstep.py --configs plain,default,default-held-plain --concurrency $c --num-prompts ${N:-64} \
    --max-tokens 96 --repeats ${R:-3} --json runs/measure-s45/lockstep_c$c.json
done
