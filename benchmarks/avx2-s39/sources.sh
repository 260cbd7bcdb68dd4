#!/bin/sh
# hybrid drafting (the default) against its two sources alone, prompt lookup and DSpark
# (adaptive verification), and plain decoding, served, all servers up, configurations
# interleaved by round, on a 2-core AVX2-only AMD EPYC.
#   sh benchmarks/avx2-s39/sources.sh          (OUT=runs/measure-s39/sources, 2 rounds)
cd "$(dirname "$0")/../.."
S="python3 -m dspark.cli.main serve --host 127.0.0.1 --port {port}"
dspark bench sweep --out "${OUT:-runs/measure-s39/sources}" --configs \
  "none=$S --speculative-config none" \
  "default=$S" \
  ngram dspark-adaptive \
  --concurrency 1,4,16 --rounds "${ROUNDS:-2}" --max-tokens 64 --dataset mixed --ignore-eos --num-prompts 32 --reference none --disable-tqdm
