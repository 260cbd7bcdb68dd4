#!/bin/sh
# Four requests: the default configuration (its governor scoring both modes against the
# fixed profile) against plain decoding, interleaved; 2-core AVX2-only AMD EPYC.
#   sh benchmarks/avx2-s41/c4.sh            (OUT=runs/measure-s41/c4, 4 rounds)
cd "$(dirname "$0")/../.."
S="python3 -m dspark.cli.main serve --host 127.0.0.1 --port {port}"
dspark bench sweep --out "${OUT:-runs/measure-s41/c4}" --configs \
  "none=$S --speculative-config none" \
  "default=$S" \
  --concurrency ${CONC:-4} --rounds "${ROUNDS:-4}" --max-tokens 96 --dataset mixed --ignore-eos --num-prompts 64 \
  --reference none --tiers 10,20,30,40 --server-timeout 900 --disable-tqdm
