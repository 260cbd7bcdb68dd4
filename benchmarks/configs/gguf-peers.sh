#!/bin/sh
# Served on the quantized GGUF a user holds: our plain decoding and the default (the file's
# blocks as stored: --dtype auto = q8x where it measures faster, else gguf) against llama.cpp's
# plain server and its ngram-simple speculation on the same file; all servers up, rounds alternating. For the default model's
# files, also our plain decoding of the same file dequantized to bf16 (--dtype bf16x: what a
# quantized file was served as before the gguf precision). WITH_Q8X=1 adds our plain and default
# in the q8x precision (the same blocks, int8 activations: llama.cpp's arithmetic, batch-invariant).
#   MODEL=path/to/file.gguf sh benchmarks/configs/gguf-peers.sh     # OUT=runs/gguf-peers
# Files: the Qwen2.5-Coder Q4_K_M from scripts/fetch_qwen_coder.sh; the default model's Q8_0 and
# Q4_K_M from llama.cpp's llama-quantize --allow-requantize of the embedded Q4_1 file.
M=${MODEL:?MODEL=FILE.gguf}
S="python3 -m dspark.cli.main serve --model $M --host 127.0.0.1 --port {port}"
L=".llama.cpp/build/bin/llama-server -m $M -t 2 -tb 2 -np 16 -c 32768 --no-warmup --host 127.0.0.1 --port {port}"
EXTRA=""
[ -n "$WITH_BF16X" ] && EXTRA="plain-bf16x=$S --dtype bf16x --speculative-config none"
Q8X=""
Q8X_DEFAULT=""
[ -n "$WITH_Q8X" ] && Q8X="plain-q8x=$S --dtype q8x --speculative-config none" && Q8X_DEFAULT="default-q8x=$S --dtype q8x"
dspark bench sweep --out "${OUT:-runs/gguf-peers}" --configs \
  "plain=$S --speculative-config none" \
  "default=$S" \
  ${EXTRA:+"$EXTRA"} \
  ${Q8X:+"$Q8X"} \
  ${Q8X_DEFAULT:+"$Q8X_DEFAULT"} \
  "llama.cpp=$L" \
  "llama.cpp-ngram=$L --spec-type ngram-simple --spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m 7" \
  --concurrency "${CONC:-1,16}" --rounds "${ROUNDS:-3}" --max-tokens "${TOKENS:-64}" --dataset mixed --ignore-eos \
  --num-prompts "${PROMPTS:-16}" --seed "${SEED:-0}" --reference llama.cpp --tiers 10,20,40 --server-timeout 900 --disable-tqdm
