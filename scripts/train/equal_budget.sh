#!/usr/bin/env bash
# The paper's comparison at one budget: DSpark, DFlash and Eagle3 trained on the same
# responses, with the same visits (4 per step, 64 anchors each: the same position-1
# examples per step), the same schedule and the same number of steps, one after
# another on every thread (two runs at once on two cores slow both far more than 2x).
#
#   bash scripts/train/equal_budget.sh                 # 800 steps each (~40 min on 2 cores)
#   STEPS=3000 THREADS=16 bash scripts/train/equal_budget.sh
#   RESUME=1 bash scripts/train/equal_budget.sh        # after an interruption
#
# DSpark and DFlash start from the target's last layers (`--init target`, taps ending in
# the last layer: the start the A/B in the shipped README chose); Eagle3 is one layer
# with its own three taps and a random start (its size is not the target's layer).
# Outputs: runs/equal/<method>/ (train_log.jsonl, checkpoints), then the held-out
# curves of the three on one figure (runs/equal/curves.png) and their table.
set -euo pipefail
cd "$(dirname "$0")/../.."
STEPS=${STEPS:-800}
THREADS=${THREADS:-2}
DATA=${DATA:-runs/data/train.jsonl}
HELD=${HELD:-runs/data/heldout.jsonl}
CACHE=${CACHE:-runs/feature-cache}
OUT=${OUT:-runs/equal}
RESUME=${RESUME:+--resume}
mkdir -p "$OUT"

COMMON=(--data "$DATA" --eval-data "$HELD" --feature-cache "$CACHE" --draft-vocab-size 8192
        --batch-size 4 --blocks-per-seq 64 --position-decay 2 --lr 6e-4 --dtype bf16
        --max-steps "$STEPS" --save-every 100 --save-every-min 6 --threads "$THREADS"
        --no-progress --log-every 10 $RESUME)
declare -A ARGS=(
  [dspark]="--block-size 7 --sample-from-anchor --markov-rank 64 --init target --target-layer-ids 1,8,14,20,27,29"
  [dflash]="--block-size 8 --init target --target-layer-ids 1,8,14,20,27,29"
  [eagle3]="--ttt-steps 7"
)
for m in ${METHODS:-dspark dflash eagle3}; do
  if [ -z "$RESUME" ] && [ -f "$OUT/$m/train_log.jsonl" ]; then
    echo "$OUT/$m exists: RESUME=1 to continue it, or remove it" >&2; exit 1
  fi
  echo "[equal-budget] $m: $STEPS steps -> $OUT/$m (log $OUT/$m.log)"
  # shellcheck disable=SC2086
  dspark train --method "$m" --out "$OUT/$m" "${COMMON[@]}" ${ARGS[$m]} >"$OUT/$m.log" 2>&1
done
python3 scripts/train/plot_runs.py --out "$OUT/curves.png" \
  dspark="$OUT/dspark/train_log.jsonl" dflash="$OUT/dflash/train_log.jsonl" eagle3="$OUT/eagle3/train_log.jsonl"
