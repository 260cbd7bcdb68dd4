#!/bin/sh
# Our plain decoding and default configuration against llama.cpp's plain server and its
# ngram-simple speculation, the sweep of benchmarks/avx512bf16-s44/peers.sh run on a
# 2-core AMD EPYC with AVX2 + FMA, no AVX-512 (benchmarks/avx2-s47/lscpu.txt).
#   bash scripts/install_llama_cpp.sh && python3 scripts/peer_llama_cpp.py --methods dspark
#   sh benchmarks/avx2-s47/peers.sh            (OUT=benchmarks/avx2-s47/peers, 3 rounds)
cd "$(dirname "$0")/../.."
OUT="${OUT:-benchmarks/avx2-s47/peers}" exec sh benchmarks/avx512bf16-s44/peers.sh
