#!/bin/sh
# The default (with the reply history, empty at start) against plain decoding and a second
# plain server (A/A), served: all servers up, 3 rounds alternating, new prompts every round.
#   sh benchmarks/amx-s56/served.sh            (OUT=benchmarks/amx-s56/served)
cd "$(dirname "$0")/../.."
S="python3 -m dspark.cli.main serve --host 127.0.0.1 --port {port}"
dspark bench sweep --out "${OUT:-benchmarks/amx-s56/served}" --configs \
  "none=$S --speculative-config none" \
  "default=$S" \
  "none-again=$S --speculative-config none" \
  --concurrency ${CONC:-1,4,16,32} --rounds "${ROUNDS:-3}" --max-tokens 64 --dataset mixed --ignore-eos --num-prompts 32 \
  --reference none --tiers 10,20,30,40 --server-timeout 900 --disable-tqdm
