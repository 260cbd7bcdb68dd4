#!/bin/sh
# The default configuration (hybrid: DSpark + prompt lookup, adaptive verification, the
# plain-decoding fallback governing from 2 requests) against plain decoding and against
# each of its two sources alone: DSpark under the same governor, prompt lookup (fixed
# verification: it has no confidences, so no step-time table and no governor); all servers up, configurations
# interleaved by round, new prompts every round. 2-core AVX2-only AMD EPYC (family 25;
# avx2, fma, f16c; no avx512): benchmarks/avx2-s42/lscpu.txt.
#   sh benchmarks/avx2-s42/sources.sh            (OUT=runs/measure-s42/sources, 3 rounds)
cd "$(dirname "$0")/../.."
S="python3 -m dspark.cli.main serve --host 127.0.0.1 --port {port}"
DSPARK='{"method": "dspark", "enable_adaptive_verification": true, "plain_fallback": 8, "plain_trials_from": 2}'
dspark bench sweep --out "${OUT:-runs/measure-s42/sources}" --configs \
  "none=$S --speculative-config none" \
  "default=$S" \
  "dspark=$S --speculative-config '$DSPARK'" \
  "lookup=$S --speculative-config '{\"method\": \"ngram\"}'" \
  --concurrency ${CONC:-1,4,16,32} --rounds "${ROUNDS:-3}" --max-tokens 96 --dataset mixed --ignore-eos --num-prompts 64 \
  --reference none --tiers 10,20,30,40 --server-timeout 900 --disable-tqdm
