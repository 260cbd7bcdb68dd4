#!/bin/sh
# The second target at one request (bf16w, then fp32), engine alone, stepped in turn: plain decoding,
# prompt lookup verifying up to 7 tokens (the n-gram drafter's default) and up to 3.
#   sh benchmarks/avx2-s48/qwen_lookup_k.sh
cd "$(dirname "$0")/../.."
Q=$(ls -d ~/.cache/dspark/models/qwen2.5-coder-0.5b-instruct-*)
python3 scripts/bench_lockstep.py --model "$Q" --dtype bf16w --configs plain,lookup-governed-from2,lookup3-governed-from2 \
  --concurrency 1 --num-prompts 8 --max-tokens 64 --repeats 2 --json benchmarks/avx2-s48/qwen_lookup_k_c1.json
python3 scripts/bench_lockstep.py --model "$Q" --dtype fp32 --configs plain,lookup-governed-from2,lookup3-governed-from2 \
  --concurrency 1 --num-prompts 8 --max-tokens 64 --repeats 2 --json benchmarks/avx2-s48/qwen_lookup_k_c1_fp32.json
