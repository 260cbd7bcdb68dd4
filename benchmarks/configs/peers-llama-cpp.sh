#!/bin/sh
# Served: our plain decoding and the default against llama.cpp's plain server, its
# ngram-simple speculation and its draft-dspark speculation with our DSpark drafter, on the
# bf16 GGUF of the same weights, 32 slots; all servers up, rounds alternating. The README's
# speed table comes from this sweep. `llama.cpp-file`: llama.cpp on the file the default model
# is served from (its embedded Q4_1 GGUF; `auto` serves its blocks as stored where q8x measures
# faster, as on AVX2). llama.cpp-dspark runs where the exported drafter exists.
#   bash scripts/install_llama_cpp.sh
#   dspark bench peers --engine llama.cpp --methods dspark --num-prompts 12 --max-tokens 64   # leaves runs/llama_cpp/{target-bf16,draft-dspark}.gguf (DRAFT= another)
#   sh benchmarks/configs/peers-llama-cpp.sh           # OUT=runs/peers-llama-cpp
FILE=$(python3 -c "from dspark.runtime.default_model import default_gguf_path; print(default_gguf_path())")
DRAFT=${DRAFT:-runs/llama_cpp/draft-dspark.gguf}
S="python3 -m dspark.cli.main serve --host 127.0.0.1 --port {port}"
ARGS="-t 2 -tb 2 -np 32 -c 65536 --no-warmup --alias SmolLM2-135M-Instruct --host 127.0.0.1 --port {port}"
L=".llama.cpp/build/bin/llama-server -m runs/llama_cpp/target-bf16.gguf $ARGS"
D=""
[ -f "$DRAFT" ] && D="llama.cpp-dspark=$L -md $DRAFT --spec-type draft-dspark --spec-draft-n-max 7 --spec-draft-p-min 0.3"
dspark bench sweep --out "${OUT:-runs/peers-llama-cpp}" --configs \
  "none=$S --speculative-config none" \
  "default=$S" \
  "llama.cpp=$L" \
  "llama.cpp-ngram=$L --spec-type ngram-simple --spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m 7" \
  ${D:+"$D"} \
  "llama.cpp-file=.llama.cpp/build/bin/llama-server -m $FILE $ARGS" \
  --concurrency "${CONC:-1,4,16,32}" --rounds "${ROUNDS:-3}" --max-tokens 64 --dataset mixed --ignore-eos \
  --num-prompts 32 --reference none --tiers 10,20,30,40 --server-timeout 900 --disable-tqdm
