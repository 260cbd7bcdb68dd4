#!/bin/sh
# Served: our plain decoding and the default against llama.cpp's plain server, its
# ngram-simple speculation and its draft-dspark speculation with our DSpark drafter, on the
# bf16 GGUF of the same weights, 32 slots; all servers up, rounds alternating. The README's
# speed table comes from this sweep.
#   bash scripts/install_llama_cpp.sh
#   dspark bench peers --engine llama.cpp --methods dspark --num-prompts 12 --max-tokens 64   # leaves runs/llama_cpp/{target-bf16,draft-dspark}.gguf (DRAFT= another)
#   sh benchmarks/configs/peers-llama-cpp.sh           # OUT=runs/peers-llama-cpp
S="python3 -m dspark.cli.main serve --host 127.0.0.1 --port {port}"
L=".llama.cpp/build/bin/llama-server -m runs/llama_cpp/target-bf16.gguf -t 2 -tb 2 -np 32 -c 65536 --no-warmup --alias SmolLM2-135M-Instruct --host 127.0.0.1 --port {port}"
dspark bench sweep --out "${OUT:-runs/peers-llama-cpp}" --configs \
  "none=$S --speculative-config none" \
  "default=$S" \
  "llama.cpp=$L" \
  "llama.cpp-ngram=$L --spec-type ngram-simple --spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m 7" \
  "llama.cpp-dspark=$L -md ${DRAFT:-runs/llama_cpp/draft-dspark.gguf} --spec-type draft-dspark --spec-draft-n-max 7 --spec-draft-p-min 0.3" \
  --concurrency "${CONC:-1,4,16,32}" --rounds "${ROUNDS:-3}" --max-tokens 64 --dataset mixed --ignore-eos \
  --num-prompts 32 --reference none --tiers 10,20,30,40 --server-timeout 900 --disable-tqdm
