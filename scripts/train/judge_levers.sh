#!/usr/bin/env bash
# Judge the runs of scripts/train/levers.sh in the engine on prompts none was trained on:
#  1. each fitted (STS) on the held-out replies, ECE at position 1 before and after;
#  2. tau per domain and per-position acceptance at fixed length 7 (the shipped drafter,
#     each run, prompt lookup), one engine run for all;
#  3. engine alone, one request at a time, engines stepped in turn (--repeats rotates the
#     order): the hybrid with each drafter against the shipped one, the default and prompt
#     lookup alone; "outside" per step is the draft call's time beside the target's.
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
# the shipped drafter's own fit, for reference (it ships the previous temperatures: not written)
dspark calibrate --drafter "$SHIPPED" --data "$HELD" --dry-run --plot "$J/reliability-shipped.png" --json \
  >"$J/calibrate-shipped.json" 2>"$J/calibrate-shipped.log"
drafters=(--drafter "$SHIPPED")
for r in $RUNS; do drafters+=(--drafter "$OUT/$r"); done
dspark eval acceptance "${drafters[@]}" --drafter ngram --block 7 --domains math,code,chat \
  --num-prompts 10 --max-tokens 128 --max-num-seqs 10 --plot "$J/acceptance.png" --json \
  >"$J/acceptance.jsonl" 2>"$J/acceptance.log"

# the hybrid (prompt lookup and the drafter in one block, never governed) with each drafter,
# beside the default (governed: at one request it may keep lookup alone) and lookup alone
hybrid='"method": "dspark", "enable_adaptive_verification": true, "lookup": true'
configs=plain,lookup-priced,default,hybrid
extra=()
for r in $RUNS; do
  configs+=",hybrid-$r"
  extra+=(--config "hybrid-$r={$hybrid, \"model\": \"$OUT/$r\"}")
done
dspark bench engine --configs "$configs" "${extra[@]}" --concurrency 1 --num-prompts 16 \
  --max-tokens 96 --repeats "${REPEATS:-6}" --json-out "$J/engine-c1.json" >"$J/engine-c1.txt" 2>"$J/engine-c1.log"
echo "done: $J"
