#!/bin/sh
# The default against --speculative-config none, served: both servers up, configurations
# interleaved by round (dspark bench sweep). 2-core AMX Xeon (lscpu.txt); auto = bf16x.
#   sh benchmarks/amx-s54/served.sh            (OUT=benchmarks/amx-s54/served, 3 rounds)
cd "$(dirname "$0")/../.."
S="python3 -m dspark.cli.main serve --host 127.0.0.1 --port {port}"
dspark bench sweep --out "${OUT:-benchmarks/amx-s54/served}" --configs \
  "none=$S --speculative-config none" \
  "default=$S" \
  --concurrency ${CONC:-1,4,16,32} --rounds "${ROUNDS:-3}" --max-tokens 96 --dataset mixed --ignore-eos --num-prompts 32 \
  --reference none --tiers 10,20,30,40 --server-timeout 900 --disable-tqdm
