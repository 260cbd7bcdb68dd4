#!/bin/sh
# Engine alone, stepped in turn, with the session's final code (2-row/3-row kernel paths,
# batched lookup prefix in the draft, plain-Python lookup pricing) on a 2-core AVX2 EPYC:
# the default against plain decoding at 1 / 4 / 16 / 32 requests.
#   sh benchmarks/avx2-s46/lockstep_final.sh
cd "$(dirname "$0")/../.."
python3 scripts/bench_lockstep.py --configs plain,default --concurrency 1 --num-prompts 16 \
  --max-tokens 96 --repeats 3 --json runs/measure-s46/lockstep_c1_final.json
for c in 4 16 32; do
python3 scripts/bench_lockstep.py --configs plain,default --concurrency $c --num-prompts 64 \
  --max-tokens 96 --repeats 3 --json runs/measure-s46/lockstep_c${c}_final.json
done
# a second reading at one request, and two requests (the level the 2/3-row kernel paths serve too)
python3 scripts/bench_lockstep.py --configs plain,default --concurrency 1 --num-prompts 16 \
  --max-tokens 96 --repeats 3 --json runs/measure-s46/lockstep_c1_final2.json
python3 scripts/bench_lockstep.py --configs plain,default --concurrency 2 --num-prompts 32 \
  --max-tokens 96 --repeats 3 --json runs/measure-s46/lockstep_c2_final.json
python3 scripts/bench_lockstep.py --configs plain,default,hybrid --concurrency 2 --num-prompts 32 --max-tokens 96 --repeats 3 --json runs/measure-s46/lockstep_c2_hybrid.json
