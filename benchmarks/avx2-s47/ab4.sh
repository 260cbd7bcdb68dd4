#!/bin/sh
# Served at 4 requests, our servers alone: plain decoding twice (an A/A control) and the
# default, 6 rounds alternating, new prompts every round (2-core AVX2 EPYC).
#   sh benchmarks/avx2-s47/ab4.sh       (report: benchmarks/avx2-s47/ab4/sweep.md)
cd "$(dirname "$0")/../.."
S="python3 -m dspark.cli.main serve --host 127.0.0.1 --port {port}"
dspark bench sweep --out "${OUT:-benchmarks/avx2-s47/ab4}" --configs \
  "none=$S --speculative-config none" \
  "default=$S" \
  "none-again=$S --speculative-config none" \
  --concurrency ${CONC:-4} --rounds "${ROUNDS:-6}" --max-tokens 64 --dataset mixed --ignore-eos --num-prompts 32 \
  --reference none --server-timeout 900 --disable-tqdm
