#!/bin/sh
# Served at one request (CONC=1), after the lookup-only step in plain Python, our servers alone: plain decoding twice (an A/A control) and the
# default, 4 rounds alternating, new prompts every round (2-core AVX2 EPYC).
#   sh benchmarks/avx2-s50/served_c1.sh       (report: benchmarks/avx2-s50/served_c1/sweep.md)
cd "$(dirname "$0")/../.."
S="python3 -m dspark.cli.main serve --host 127.0.0.1 --port {port}"
dspark bench sweep --out "${OUT:-benchmarks/avx2-s50/served_c1}" --configs \
  "none=$S --speculative-config none" \
  "default=$S" \
  "none-again=$S --speculative-config none" \
  --concurrency ${CONC:-1} --rounds "${ROUNDS:-4}" --max-tokens 64 --dataset mixed --ignore-eos --num-prompts 16 \
  --reference none --server-timeout 900 --disable-tqdm
