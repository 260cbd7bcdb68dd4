#!/usr/bin/env bash
# Judge the runs of scripts/train/levers.sh in the engine on prompts none was trained on:
#  1. each fitted (STS) on the held-out replies, ECE at position 1 before and after;
#  2. tau per domain and per-position acceptance at fixed length 7 (the shipped drafter,
#     each run, prompt lookup), one engine run for all;
#  3. the default configuration with each drafter against prompt lookup alone, one
#     request at a time, engines stepped in turn (--repeats rotates the order).
# Pause any background training first (kill -STOP PID): two heavy jobs on two cores.
#
#   bash scripts/train/judge_levers.sh              # writes runs/levers/judge/*.json
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/levers}
HELD=${HELD:-datasets/smollm2-135m-instruct/heldout.jsonl.gz}
RUNS=${RUNS:-control vocab16k lookmiss}
SHIPPED=dspark/drafters/shipped/dspark
J="$OUT/judge"
mkdir -p "$J"

for r in $RUNS; do
  dspark calibrate --drafter "$OUT/$r" --data "$HELD" --json >"$J/calibrate-$r.json" 2>"$J/calibrate-$r.log"
done
drafters=(--drafter "$SHIPPED")
for r in $RUNS; do drafters+=(--drafter "$OUT/$r"); done
dspark eval acceptance "${drafters[@]}" --drafter ngram --block 7 --domains math,code,chat \
  --num-prompts 10 --max-tokens 128 --max-num-seqs 10 --plot "$J/acceptance.png" --json \
  >"$J/acceptance.jsonl" 2>"$J/acceptance.log"

default='"method": "dspark", "enable_adaptive_verification": true, "lookup": true, "plain_fallback": 8, "plain_trials_from": 2, "lookup_history": true'
configs=lookup,default
extra=()
for r in $RUNS; do
  configs+=",$r"
  extra+=(--config "$r={$default, \"model\": \"$OUT/$r\"}")
done
dspark bench engine --configs "plain,$configs" "${extra[@]}" --concurrency 1 --num-prompts 16 \
  --max-tokens 96 --repeats "${REPEATS:-6}" --json-out "$J/engine-c1.json" >"$J/engine-c1.txt" 2>"$J/engine-c1.log"
echo "done: $J"
