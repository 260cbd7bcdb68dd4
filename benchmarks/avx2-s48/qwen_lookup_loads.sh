#!/bin/sh
# The second target (fp32, native kernel) at 1, 4 and 16 requests, engine alone, stepped in
# turn: plain decoding, prompt lookup alone, and prompt lookup with the governor at every
# load (speculation or plain decoding by measured throughput).
#   sh benchmarks/avx2-s48/qwen_lookup_loads.sh
cd "$(dirname "$0")/../.."
Q=$(ls -d ~/.cache/dspark/models/qwen2.5-coder-0.5b-instruct-*)
for c in 1 4 16; do
  n=$((c * 4)); [ $n -lt 8 ] && n=8
  python3 scripts/bench_lockstep.py --model "$Q" --dtype fp32 --configs plain,lookup,lookup-governed \
    --concurrency $c --num-prompts $n --max-tokens 64 --repeats 2 --json benchmarks/avx2-s48/qwen_loads_c$c.json
done
