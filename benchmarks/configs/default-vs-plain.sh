#!/bin/sh
# Served: the default configuration against plain decoding, with a second plain server as
# the A/A control. All servers up, rounds alternating, new prompts every round.
#   sh benchmarks/configs/default-vs-plain.sh          # OUT=runs/default-vs-plain
#   TEMPERATURE=0.7 TOP_P=0.95 sh benchmarks/configs/default-vs-plain.sh   # sampling as chat clients ask
# Record the run: one line in benchmarks/results/default-vs-plain.jsonl (see benchmarks/README.md).
S="python3 -m dspark.cli.main serve --host 127.0.0.1 --port {port}"
dspark bench sweep --out "${OUT:-runs/default-vs-plain}" --configs \
  "none=$S --speculative-config none" \
  "default=$S" \
  "none-again=$S --speculative-config none" \
  --concurrency "${CONC:-1,4,16,32}" --rounds "${ROUNDS:-3}" --max-tokens 64 --dataset mixed --ignore-eos \
  --num-prompts "${PROMPTS:-32}" --seed "${SEED:-0}" --temperature "${TEMPERATURE:-0}" \
  ${TOP_P:+--extra-body "{\"top_p\": $TOP_P}"} \
  --reference none --tiers 10,20,30,40 --server-timeout 900 --disable-tqdm
