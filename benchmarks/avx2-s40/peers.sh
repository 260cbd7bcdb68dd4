#!/bin/sh
# Our server against llama.cpp (build 11434, bf16 GGUF of the same weights) on a 2-core
# AVX2-only AMD EPYC (family 25, no avx512): our plain decoding and default configuration,
# llama.cpp plain and its ngram-simple speculation; all servers up, configurations
# interleaved by round.
#   bash scripts/install_llama_cpp.sh && python3 scripts/peer_llama_cpp.py --methods dspark
#   sh benchmarks/avx2-s40/peers.sh            (OUT=runs/measure-s40/peers, 3 rounds)
# (llama.cpp's draft-dspark aborts at its first request in this build, even with one
# slot: GGML_ASSERT(t_layer_inp[il] != nullptr) in llama-graph.cpp; it is left out.)
cd "$(dirname "$0")/../.."
S="python3 -m dspark.cli.main serve --host 127.0.0.1 --port {port}"
L=".llama.cpp/build/bin/llama-server -m runs/llama_cpp/target-bf16.gguf -t 2 -tb 2 -np 32 -c 65536 --no-warmup --alias SmolLM2-135M-Instruct --host 127.0.0.1 --port {port}"
dspark bench sweep --out "${OUT:-runs/measure-s40/peers}" --configs \
  "none=$S --speculative-config none" \
  "default=$S" \
  "llama.cpp=$L" \
  "llama.cpp-ngram=$L --spec-type ngram-simple --spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m 7" \
  --concurrency 1,4,16,32 --rounds "${ROUNDS:-3}" --max-tokens 64 --dataset mixed --ignore-eos --num-prompts 32 \
  --reference none --tiers 10,20,30,40 --server-timeout 900 --disable-tqdm
