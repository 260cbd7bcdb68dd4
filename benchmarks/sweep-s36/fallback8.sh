#!/bin/sh
# the default (plain fallback governing 16+ requests) against the same with the fallback from 8
# requests, and plain decoding; 2-core AMD EPYC (avx512_bf16, no AMX); interleaved by round
cd "$(dirname "$0")/../.."
S="python3 -m dspark.cli.main serve --host 127.0.0.1 --port {port}"
dspark bench sweep --out runs/measure-s36/fallback8 --configs \
  "none=$S --speculative-config none" \
  "default=$S" \
  "fallback8=$S --speculative-config '{\"method\": \"dspark\", \"enable_adaptive_verification\": true, \"lookup\": true, \"plain_fallback\": 8}'" \
  --concurrency 4,16,32 --rounds 2 --max-tokens 64 --dataset mixed --ignore-eos --num-prompts 32 --reference none --disable-tqdm
