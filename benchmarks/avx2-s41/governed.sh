#!/bin/sh
# The default configuration governed from 2 requests (levels where the step-time table
# says verification is dear start with plain decoding; losing speculation trials end
# early) against the same engine governed from 8 requests only (the previous default)
# and plain decoding; all servers up, configurations interleaved by round. 2-core
# AVX2-only AMD EPYC (family 25; avx2, fma, f16c; no avx512).
#   sh benchmarks/avx2-s41/governed.sh            (OUT=runs/measure-s41/governed, 3 rounds)
cd "$(dirname "$0")/../.."
S="python3 -m dspark.cli.main serve --host 127.0.0.1 --port {port}"
FROM8='{"method": "dspark", "enable_adaptive_verification": true, "lookup": true, "plain_fallback": 8}'
dspark bench sweep --out "${OUT:-runs/measure-s41/governed}" --configs \
  "none=$S --speculative-config none" \
  "default=$S" \
  "from8=$S --speculative-config '$FROM8'" \
  --concurrency ${CONC:-4,16,32} --rounds "${ROUNDS:-3}" --max-tokens 96 --dataset mixed --ignore-eos --num-prompts 64 \
  --reference none --tiers 10,20,30,40 --server-timeout 900 --disable-tqdm
