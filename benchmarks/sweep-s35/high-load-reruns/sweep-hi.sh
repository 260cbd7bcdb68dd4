#!/bin/sh
# the default (with the contextless plain mode) against plain decoding and the hybrid without
# the fallback, at high load; configurations interleaved by round
cd "$(dirname "$0")/../../.."
S="python3 -m dspark.cli.main serve --host 127.0.0.1 --port {port}"
dspark bench sweep --out runs/measure-s35/sweep-hi --configs \
  "none=$S --speculative-config none" \
  "default=$S" \
  "hybrid=$S --speculative-config '{\"method\": \"dspark\", \"enable_adaptive_verification\": true, \"lookup\": true}'" \
  --concurrency 16,32 --rounds 3 --max-tokens 64 --dataset mixed --ignore-eos --num-prompts 32 --reference none --disable-tqdm
