#!/bin/sh
# the default configuration against plain decoding on a 2-core AMD EPYC (avx512_bf16, no AMX),
# after the attention/prefetch kernels; configurations interleaved by round.
#   benchmarks/sweep-s36/sweep-s36.sh                                   (the first sweep: 3 rounds)
#   ROUNDS=2 OUT=runs/measure-s36/final benchmarks/sweep-s36/sweep-s36.sh  (the one at the end)
cd "$(dirname "$0")/../.."
S="python3 -m dspark.cli.main serve --host 127.0.0.1 --port {port}"
dspark bench sweep --out "${OUT:-runs/measure-s36/sweep}" --configs \
  "none=$S --speculative-config none" \
  "default=$S" \
  --concurrency 1,4,16,32 --rounds "${ROUNDS:-3}" --max-tokens 64 --dataset mixed --ignore-eos --num-prompts 32 --reference none --disable-tqdm
