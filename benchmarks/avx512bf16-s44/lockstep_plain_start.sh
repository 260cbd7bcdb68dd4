#!/bin/sh
# After the longer first gap at levels that start plain (PLAIN_START_GAPS): the default
# against plain decoding at 16 and 32 requests (the same runs as lockstep.sh), and at 16
# over 256 prompts, long enough for the level's speculation trials to run.
# 2-core AMD EPYC with avx512_bf16, no AMX: benchmarks/avx512bf16-s44/lscpu.txt.
cd "$(dirname "$0")/../.."
for c in 16 32; do
  python3 scripts/bench_lockstep.py --configs plain,default,dspark --concurrency $c --num-prompts 64 \
    --max-tokens 96 --repeats 3 --json runs/measure-s44/lockstep_c${c}_psg.json
done
python3 scripts/bench_lockstep.py --configs plain,default --concurrency 16 --num-prompts 256 \
  --max-tokens 96 --repeats 3 --json runs/measure-s44/lockstep_c16_long_psg.json
