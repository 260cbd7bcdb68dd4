#!/bin/sh
# After the governor's early exit at levels that start plain (a speculation trial there
# keeps its triple length only while level with plain decoding): the default (hybrid:
# DSpark + prompt lookup, adaptive verification, governed from 2 requests) against
# plain decoding and against DSpark alone under the same governor; all servers up,
# configurations interleaved by round, new prompts every round. 2-core AVX2-only AMD
# EPYC (family 25; avx2, fma, f16c; no avx512): benchmarks/avx2-s43/lscpu.txt.
#   sh benchmarks/avx2-s43/sources.sh            (OUT=runs/measure-s43/sources, 4 rounds)
cd "$(dirname "$0")/../.."
S="python3 -m dspark.cli.main serve --host 127.0.0.1 --port {port}"
DSPARK='{"method": "dspark", "enable_adaptive_verification": true, "plain_fallback": 8, "plain_trials_from": 2}'
dspark bench sweep --out "${OUT:-runs/measure-s43/sources}" --configs \
  "none=$S --speculative-config none" \
  "default=$S" \
  "dspark=$S --speculative-config '$DSPARK'" \
  --concurrency ${CONC:-4,16,32} --rounds "${ROUNDS:-4}" --max-tokens 96 --dataset mixed --ignore-eos --num-prompts 64 \
  --reference none --tiers 10,20,30,40 --server-timeout 900 --disable-tqdm
