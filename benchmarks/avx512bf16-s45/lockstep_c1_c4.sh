#!/bin/sh
# Engine alone, stepped in turn: the default against plain decoding at 1 and 4 requests,
# with whole-step pricing and the queued live table (the session's final code).
#   sh benchmarks/avx512bf16-s45/lockstep_c1_c4.sh > benchmarks/avx512bf16-s45/lockstep_c1_c4.log
cd "$(dirname "$0")/../.."
python3 scripts/bench_lockstep.py --configs plain,default --concurrency 1 --num-prompts 16 \
  --max-tokens 96 --repeats 3 --json runs/measure-s45/lockstep_c1.json
python3 scripts/bench_lockstep.py --configs plain,default --concurrency 4 --num-prompts 64 \
  --max-tokens 96 --repeats 3 --json runs/measure-s45/lockstep_c4.json
