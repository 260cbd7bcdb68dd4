#!/bin/sh
# the default configuration against plain decoding and prompt lookup alone on a 2-core
# AVX2-only AMD EPYC (family 25, no avx512), after the AVX2 attention and 7-15-row matmul
# kernels; configurations interleaved by round.
#   sh benchmarks/avx2-s39/sweep.sh            (OUT=runs/measure-s39/sweep, 3 rounds)
#   NGRAM=1 sh benchmarks/avx2-s39/sweep.sh    (prompt lookup alone as a third configuration)
cd "$(dirname "$0")/../.."
S="python3 -m dspark.cli.main serve --host 127.0.0.1 --port {port}"
dspark bench sweep --out "${OUT:-runs/measure-s39/sweep}" --configs \
  "none=$S --speculative-config none" \
  "default=$S" \
  ${NGRAM:+ngram} \
  --concurrency 1,4,16,32 --rounds "${ROUNDS:-3}" --max-tokens 64 --dataset mixed --ignore-eos --num-prompts 32 --reference none --disable-tqdm
