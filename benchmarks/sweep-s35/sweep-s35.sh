#!/bin/sh
# the default (hybrid + plain fallback from 16 requests) against plain decoding, the hybrid
# without the fallback, DSpark alone and prompt lookup alone; configurations interleaved by round
cd "$(dirname "$0")/../.."
S="python3 -m dspark.cli.main serve --host 127.0.0.1 --port {port}"
dspark bench sweep --out runs/measure-s35/sweep --configs \
  "none=$S --speculative-config none" \
  "default=$S" \
  "hybrid=$S --speculative-config '{\"method\": \"dspark\", \"enable_adaptive_verification\": true, \"lookup\": true}'" \
  "dspark-adaptive=$S --speculative-config '{\"method\": \"dspark\", \"enable_adaptive_verification\": true}'" \
  "ngram=$S --speculative-config '{\"method\": \"ngram\"}'" \
  --concurrency 1,4,16,32 --rounds 2 --max-tokens 64 --dataset mixed --ignore-eos --num-prompts 32 --reference none --disable-tqdm
