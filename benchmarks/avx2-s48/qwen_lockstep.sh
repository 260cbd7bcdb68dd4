#!/bin/sh
# The second target (Qwen2.5-Coder-0.5B-Instruct, fp32) at one request, engine alone,
# stepped in turn: plain decoding against prompt lookup (fixed verification), with the
# native fp32 kernel (this revision) and, for comparison, at the revision before it
# (torch's F.linear), given as $1 (a checkout's path).
#   sh benchmarks/avx2-s48/qwen_lockstep.sh [/path/to/checkout-before]
cd "$(dirname "$0")/../.."
Q=$(ls -d ~/.cache/dspark/models/qwen2.5-coder-0.5b-instruct-*)
python3 scripts/bench_lockstep.py --model "$Q" --dtype fp32 --configs plain,lookup --concurrency 1 \
  --num-prompts 8 --max-tokens 64 --repeats 2 --json benchmarks/avx2-s48/qwen_c1_f32w.json
if [ -n "$1" ]; then
  PYTHONPATH="$1" python3 "$1/scripts/bench_lockstep.py" --model "$Q" --dtype fp32 --configs plain,lookup \
    --concurrency 1 --num-prompts 8 --max-tokens 64 --repeats 2 --json benchmarks/avx2-s48/qwen_c1_torch.json
fi
