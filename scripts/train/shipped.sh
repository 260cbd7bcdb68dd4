#!/usr/bin/env bash
# Train, calibrate and evaluate the four shipped drafters for the default model with
# one recipe and one budget (see dspark/drafters/shipped/README.md for the numbers).
#
#   bash scripts/train/shipped.sh            # CPU: two runs at a time, one thread each
#   MINUTES=8 PAR=4 THREADS=4 bash scripts/train/shipped.sh   # a bigger machine or a GPU
#
# Inputs: runs/data/train.jsonl and runs/data/heldout.jsonl (`dspark data generate`,
# commands in the shipped README). Every run checkpoints every SAVE_MIN minutes and
# resumes from its last checkpoint when the script is started again (RESUME=1), so a
# lost machine costs at most one interval. Outputs under runs/train/<method>/.
set -euo pipefail
cd "$(dirname "$0")/../.."
MINUTES=${MINUTES:-30}          # training wall time per method (the budget)
THREADS=${THREADS:-1}           # torch threads per run
PAR=${PAR:-2}                   # runs at a time
SAVE_MIN=${SAVE_MIN:-5}
VOCAB=${VOCAB:-8192}
DATA=${DATA:-runs/data/train.jsonl}
HELD=${HELD:-runs/data/heldout.jsonl}
CACHE=${CACHE:-runs/feature-cache}
OUT=${OUT:-runs/train}
RESUME=${RESUME:+--resume}
mkdir -p "$OUT" runs/logs

COMMON=(--data "$DATA" --eval-data "$HELD" --feature-cache "$CACHE" --draft-vocab-size "$VOCAB"
        --batch-size 4 --position-decay 2 --threads "$THREADS" --no-progress --log-every 10
        --save-every-min "$SAVE_MIN" --time-limit-min "$MINUTES" $RESUME)
declare -A ARGS=(
  [dspark]="--block-size 7 --sample-from-anchor --markov-rank 64 --blocks-per-seq 64 --max-steps 1150"
  [dflash]="--block-size 8 --blocks-per-seq 64 --max-steps 1100"
  [eagle3]="--ttt-steps 7 --blocks-per-seq 256 --max-steps 420"
  [mtp]="--blocks-per-seq 256 --max-steps 2600"
)

# The feature cache (target hidden states + top-k of p) is built once, with every thread.
dspark train --method mtp --data "$DATA" --feature-cache "$CACHE" --eval-data "$HELD" --max-steps 1 \
    --out "$OUT/.cache-build" --no-progress --save-every-min 60 >runs/logs/cache.log 2>&1

run() {
  local m=$1
  # shellcheck disable=SC2086
  dspark train --method "$m" --out "$OUT/$m" "${COMMON[@]}" ${ARGS[$m]} >"runs/logs/train-$m.log" 2>&1
}
n=0
for m in dspark dflash eagle3 mtp; do
  run "$m" &
  n=$((n + 1))
  if [ "$n" -ge "$PAR" ]; then wait -n; n=$((n - 1)); fi
done
wait
dspark calibrate --drafter "$OUT/dspark" --data "$HELD" >runs/logs/calibrate.log 2>&1
echo "done: $OUT/{dspark,dflash,eagle3,mtp}; logs in runs/logs/"
