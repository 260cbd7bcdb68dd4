#!/bin/sh
# Sixteen requests, with a control: two plain-decoding servers (none, none-b: the same
# command) beside the default, all up at once, interleaved by round, new prompts every
# round. none-b / none is what this machine's drift alone does to a ratio; default / none
# is read against it. 2-core AVX2-only AMD EPYC (family 25; avx2, fma, f16c; no avx512):
# benchmarks/avx2-s43/lscpu.txt.
#   sh benchmarks/avx2-s43/aa16.sh            (OUT=runs/measure-s43/aa16, 6 rounds)
cd "$(dirname "$0")/../.."
S="python3 -m dspark.cli.main serve --host 127.0.0.1 --port {port}"
dspark bench sweep --out "${OUT:-runs/measure-s43/aa16}" --configs \
  "none=$S --speculative-config none" \
  "none-b=$S --speculative-config none" \
  "default=$S" \
  --concurrency ${CONC:-16} --rounds "${ROUNDS:-6}" --max-tokens 96 --dataset mixed --ignore-eos --num-prompts 64 \
  --reference none --tiers 10,20,30,40 --server-timeout 900 --disable-tqdm
