#!/bin/sh
# The second target (fp32, native kernel), engine alone, stepped in turn: plain decoding,
# prompt lookup governed from 2 requests ({"method": "ngram", "plain_fallback": 2}: one
# request ungoverned, 2 and more starting plain with speculation trials), and a second
# plain engine as the A/A control.
#   sh benchmarks/avx2-s48/qwen_from2.sh
cd "$(dirname "$0")/../.."
Q=$(ls -d ~/.cache/dspark/models/qwen2.5-coder-0.5b-instruct-*)
for cn in "1 8" "4 32" "16 64"; do
  set -- $cn
  python3 scripts/bench_lockstep.py --model "$Q" --dtype fp32 --configs plain,lookup-governed-from2,plain-again \
    --concurrency $1 --num-prompts $2 --max-tokens 64 --repeats 2 --json benchmarks/avx2-s48/qwen_from2_c$1.json
done
