#!/bin/sh
# The second target served: `dspark serve --model Q` as it starts without --speculative-config
# (prompt lookup alone, LOOKUP_DEFAULT; auto picks bf16w here) against --speculative-config none,
# both servers up, rounds alternating (dspark bench sweep).
#   sh benchmarks/avx2-s48/qwen_served.sh
cd "$(dirname "$0")/../.."
Q=$(ls -d ~/.cache/dspark/models/qwen2.5-coder-0.5b-instruct-*)
dspark bench sweep --out benchmarks/avx2-s48/qwen_served --configs none "default=dspark serve --model $Q --port {port}" \
  --server-args "--model $Q" --concurrency 1,4 --rounds 3 --num-prompts 8 --max-tokens 64 --ignore-eos \
  --dataset mixed --reference none --disable-tqdm
