#!/bin/sh
# Engine alone, stepped in turn, with the precomputed Markov walk (markov_walk.py) on a
# 2-core AVX2 EPYC: the default against plain decoding at 1 and 4 requests, with an A/A
# plain control at 4.
#   sh benchmarks/avx2-s47/lockstep.sh
cd "$(dirname "$0")/../.."
python3 scripts/bench_lockstep.py --configs plain,default --concurrency 1 --num-prompts 16 \
  --max-tokens 96 --repeats 3 --json benchmarks/avx2-s47/lockstep_c1.json
python3 scripts/bench_lockstep.py --configs plain,default,plain-again --concurrency 4 --num-prompts 64 \
  --max-tokens 96 --repeats 3 --json benchmarks/avx2-s47/lockstep_c4.json
