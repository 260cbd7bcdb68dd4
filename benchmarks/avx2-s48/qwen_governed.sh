#!/bin/sh
# The second target (fp32, native kernel), engine alone, stepped in turn: plain decoding
# against prompt lookup governed at every load ({"method": "ngram", "plain_fallback": true}),
# after the engine builds the governor's step-time table for fixed verification too.
#   sh benchmarks/avx2-s48/qwen_governed.sh
cd "$(dirname "$0")/../.."
Q=$(ls -d ~/.cache/dspark/models/qwen2.5-coder-0.5b-instruct-*)
for cn in "1 8" "4 32" "16 64"; do
  set -- $cn
  python3 scripts/bench_lockstep.py --model "$Q" --dtype fp32 --configs plain,lookup-governed \
    --concurrency $1 --num-prompts $2 --max-tokens 64 --repeats 2 --json benchmarks/avx2-s48/qwen_governed_c$1.json
done
