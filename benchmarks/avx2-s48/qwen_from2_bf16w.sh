#!/bin/sh
# As qwen_from2.sh, in bf16w (what `auto` picks for the second target on this CPU).
#   sh benchmarks/avx2-s48/qwen_from2_bf16w.sh
cd "$(dirname "$0")/../.."
Q=$(ls -d ~/.cache/dspark/models/qwen2.5-coder-0.5b-instruct-*)
for cn in "1 8" "4 32"; do
  set -- $cn
  python3 scripts/bench_lockstep.py --model "$Q" --dtype bf16w --configs plain,lookup-governed-from2,plain-again \
    --concurrency $1 --num-prompts $2 --max-tokens 64 --repeats 2 --json benchmarks/avx2-s48/qwen_from2_bf16w_c$1.json
done
