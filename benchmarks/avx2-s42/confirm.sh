#!/bin/sh
# The default configuration after the governor's two changes (speculation chosen only
# 2 % ahead of plain decoding, scores over a mode's decayed runs; prompts admitted
# while nothing decodes at the level they will decode at) against plain decoding,
# interleaved, new prompts every round. 2-core AVX2-only AMD EPYC (family 25; avx2,
# fma, f16c; no avx512): benchmarks/avx2-s42/lscpu.txt.
#   sh benchmarks/avx2-s42/confirm.sh            (OUT=runs/measure-s42/confirm, 3 rounds)
cd "$(dirname "$0")/../.."
S="python3 -m dspark.cli.main serve --host 127.0.0.1 --port {port}"
dspark bench sweep --out "${OUT:-runs/measure-s42/confirm}" --configs \
  "none=$S --speculative-config none" \
  "default=$S" \
  --concurrency ${CONC:-4,16,32} --rounds "${ROUNDS:-3}" --max-tokens 96 --dataset mixed --ignore-eos --num-prompts 64 \
  --reference none --tiers 10,20,30,40 --server-timeout 900 --disable-tqdm
