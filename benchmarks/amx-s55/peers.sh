#!/bin/sh
# Our plain decoding and default configuration against llama.cpp's plain server and its
# ngram-simple speculation, the sweep of benchmarks/avx512bf16-s44/peers.sh run on a
# 2-core Intel Xeon with AMX and avx512_bf16 (benchmarks/amx-s55/lscpu.txt; `auto` picks bf16x).
#   bash scripts/install_llama_cpp.sh && python3 scripts/peer_llama_cpp.py --methods dflash --num-prompts 4 --max-tokens 32
#   sh benchmarks/amx-s55/peers.sh            (OUT=benchmarks/amx-s55/peers, 3 rounds)
cd "$(dirname "$0")/../.."
OUT="${OUT:-benchmarks/amx-s55/peers}" exec sh benchmarks/avx512bf16-s44/peers.sh
