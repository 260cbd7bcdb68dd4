#!/bin/sh
# Our plain decoding against the default, the two servers alone (no llama.cpp beside them),
# at 16 and 32 requests, 4 rounds; otherwise as peers.sh.
#   sh benchmarks/avx512bf16-s44/ab16_32.sh        (OUT=runs/measure-s44/ab16_32)
cd "$(dirname "$0")/../.."
S="python3 -m dspark.cli.main serve --host 127.0.0.1 --port {port}"
dspark bench sweep --out "${OUT:-runs/measure-s44/ab16_32}" --configs \
  "none=$S --speculative-config none" \
  "default=$S" \
  --concurrency ${CONC:-16,32} --rounds "${ROUNDS:-4}" --max-tokens 64 --dataset mixed --ignore-eos --num-prompts 32 \
  --reference none --server-timeout 900 --disable-tqdm
