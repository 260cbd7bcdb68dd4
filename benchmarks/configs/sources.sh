#!/bin/sh
# Served: the default (hybrid drafting) against its two sources, prompt lookup alone and the
# DSpark drafter alone, and plain decoding; all servers up, rounds alternating.
#   sh benchmarks/configs/sources.sh                   # OUT=runs/sources
S="python3 -m dspark.cli.main serve --host 127.0.0.1 --port {port}"
dspark bench sweep --out "${OUT:-runs/sources}" --configs \
  "none=$S --speculative-config none" \
  "default=$S" \
  "ngram=$S --speculative-config '{\"method\": \"ngram\", \"enable_adaptive_verification\": true}'" \
  "dspark-adaptive=$S --speculative-config '{\"method\": \"dspark\", \"enable_adaptive_verification\": true}'" \
  --concurrency "${CONC:-1,4,16,32}" --rounds "${ROUNDS:-3}" --max-tokens 64 --dataset mixed --ignore-eos \
  --num-prompts 32 --reference none --tiers 10,20,30,40 --server-timeout 900 --disable-tqdm
