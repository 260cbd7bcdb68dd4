#!/bin/sh
# Our plain decoding and default configuration against llama.cpp's plain server, its
# ngram-simple speculation and its draft-dspark speculation with our DSpark drafter moved
# off the target's last layer (taps 1,8,14,20,27,28: llama.cpp reads a tap as the next
# layer's input, so the shipped drafter's tap 29 cannot be served there). Build 11434, bf16
# GGUFs of the same weights, 32 slots; all servers up, configurations interleaved by
# round, new prompts every round. 2-core Intel Xeon with AMX and avx512_bf16 (lscpu.txt).
#   bash scripts/install_llama_cpp.sh
#   python3 scripts/peer_llama_cpp.py --drafter DRAFTER --work runs/llama_cpp_retap   # converts it
#   DRAFT=runs/llama_cpp_retap/draft-dspark.gguf sh benchmarks/amx-s57/peers.sh
cd "$(dirname "$0")/../.."
S="python3 -m dspark.cli.main serve --host 127.0.0.1 --port {port}"
L=".llama.cpp/build/bin/llama-server -m runs/llama_cpp/target-bf16.gguf -t 2 -tb 2 -np 32 -c 65536 --no-warmup --alias SmolLM2-135M-Instruct --host 127.0.0.1 --port {port}"
dspark bench sweep --out "${OUT:-benchmarks/amx-s57/peers}" --configs \
  "none=$S --speculative-config none" \
  "default=$S" \
  "llama.cpp=$L" \
  "llama.cpp-ngram=$L --spec-type ngram-simple --spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m 7" \
  "llama.cpp-dspark=$L -md ${DRAFT:-runs/llama_cpp_retap/draft-dspark.gguf} --spec-type draft-dspark --spec-draft-n-max 7 --spec-draft-p-min 0.3" \
  --concurrency ${CONC:-1,4,16,32} --rounds "${ROUNDS:-3}" --max-tokens 64 --dataset mixed --ignore-eos --num-prompts 32 \
  --reference none --tiers 10,20,30,40 --server-timeout 900 --disable-tqdm
