#!/bin/sh
# Our plain decoding and default configuration against llama.cpp's plain server and its
# ngram-simple speculation (build 11434, bf16 GGUF of the same weights; its own prompt
# cache on, as shipped); all servers up, configurations interleaved by round, new prompts
# every round. 2-core AMD EPYC with AVX2 + FMA, no AVX-512: benchmarks/avx2-s47/lscpu.txt.
#   bash scripts/install_llama_cpp.sh && python3 scripts/peer_llama_cpp.py --methods dspark
#   sh benchmarks/avx2-s47/peers.sh            (OUT=benchmarks/avx2-s47/peers, 3 rounds)
cd "$(dirname "$0")/../.."
S="python3 -m dspark.cli.main serve --host 127.0.0.1 --port {port}"
L=".llama.cpp/build/bin/llama-server -m runs/llama_cpp/target-bf16.gguf -t 2 -tb 2 -np 32 -c 65536 --no-warmup --alias SmolLM2-135M-Instruct --host 127.0.0.1 --port {port}"
dspark bench sweep --out "${OUT:-benchmarks/avx2-s47/peers}" --configs \
  "none=$S --speculative-config none" \
  "default=$S" \
  "llama.cpp=$L" \
  "llama.cpp-ngram=$L --spec-type ngram-simple --spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m 7" \
  --concurrency ${CONC:-1,4,16,32} --rounds "${ROUNDS:-3}" --max-tokens 64 --dataset mixed --ignore-eos --num-prompts 32 \
  --reference none --tiers 10,20,30,40 --server-timeout 900 --disable-tqdm
