#!/bin/sh
# The prefix cache: plain decoding with and without it, the default configuration with
# it, and llama.cpp's plain server (build 11434, bf16 GGUF of the same weights; its own
# prompt cache on, as shipped); all servers up, configurations interleaved by round.
# 2-core AVX2-only AMD EPYC (family 25; avx2, fma, f16c; no avx512).
#   bash scripts/install_llama_cpp.sh && python3 scripts/peer_llama_cpp.py --methods dspark
#   sh benchmarks/avx2-s41/prefix.sh            (OUT=runs/measure-s41/prefix, 3 rounds)
cd "$(dirname "$0")/../.."
S="python3 -m dspark.cli.main serve --host 127.0.0.1 --port {port}"
L=".llama.cpp/build/bin/llama-server -m runs/llama_cpp/target-bf16.gguf -t 2 -tb 2 -np 32 -c 65536 --no-warmup --alias SmolLM2-135M-Instruct --host 127.0.0.1 --port {port}"
dspark bench sweep --out "${OUT:-runs/measure-s41/prefix}" --configs \
  "none=$S --speculative-config none" \
  "none-nocache=$S --speculative-config none --no-prefix-caching" \
  "default=$S" \
  "llama.cpp=$L" \
  --concurrency ${CONC:-1,32} --rounds "${ROUNDS:-3}" --max-tokens 64 --dataset mixed --ignore-eos --num-prompts 32 \
  --reference none --tiers 10,20,30,40 --server-timeout 900 --disable-tqdm
