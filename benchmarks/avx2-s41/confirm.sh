#!/bin/sh
# The default configuration (governed from 2 requests) against plain decoding at 1, 4 and
# 16 requests, both servers up, interleaved by round; 2-core AVX2-only AMD EPYC.
#   sh benchmarks/avx2-s41/confirm.sh            (OUT=runs/measure-s41/confirm, 3 rounds)
cd "$(dirname "$0")/../.."
S="python3 -m dspark.cli.main serve --host 127.0.0.1 --port {port}"
dspark bench sweep --out "${OUT:-runs/measure-s41/confirm}" --configs \
  "none=$S --speculative-config none" \
  "default=$S" \
  --concurrency ${CONC:-1,4,16} --rounds "${ROUNDS:-3}" --max-tokens 96 --dataset mixed --ignore-eos --num-prompts 32 \
  --reference none --tiers 10,20,30,40 --server-timeout 900 --disable-tqdm
