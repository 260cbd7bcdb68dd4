#!/usr/bin/env bash
# The two drafter levers of docs/journal.md (2026-12-06, "Drafter levers on a CPU"), each
# a continuation of the shipped DSpark drafter at equal steps beside the same
# continuation without the lever, then judged in the engine (scripts/train/judge_levers.sh).
#
#   bash scripts/train/levers.sh                      # all three, one after another
#   RUNS="control lookmiss" bash scripts/train/levers.sh
#   RESUME=1 bash scripts/train/levers.sh             # after an interruption
#
#   control   the shipped drafter continued on the same data, nothing changed
#   vocab16k  its draft vocabulary grown 8,192 -> 16,384 (new LM-head rows from the target's)
#   lookmiss  the anchors where prompt lookup would not propose the next token weigh 4x
#
# Same data, order, schedule and steps for all three; both threads each, one at a time
# (two runs at once on two cores slow both far more than 2x). Outputs: runs/levers/<run>/.
set -euo pipefail
cd "$(dirname "$0")/../.."
STEPS=${STEPS:-600}
THREADS=${THREADS:-2}
DATA=${DATA:-datasets/smollm2-135m-instruct/train.jsonl.gz}
HELD=${HELD:-datasets/smollm2-135m-instruct/heldout.jsonl.gz}
CACHE=${CACHE:-runs/feature-cache-28}
OUT=${OUT:-runs/levers}
RESUME=${RESUME:+--resume}
mkdir -p "$OUT"

COMMON=(--method dspark --data "$DATA" --eval-data "$HELD" --feature-cache "$CACHE"
        --init dspark/drafters/shipped/dspark --batch-size 4 --position-decay 2 --blocks-per-seq 64
        --lr 3e-4 --max-steps "$STEPS" --save-every 100 --save-every-min 10 --log-every 10
        --dtype bf16w --threads "$THREADS" --no-progress $RESUME)
declare -A ARGS=(
  [control]=""
  [vocab16k]="--draft-vocab-size 16384"
  [lookmiss]="--lookup-miss-weight 3"
)
for r in ${RUNS:-vocab16k control lookmiss}; do
  echo "[levers] $r: $STEPS steps -> $OUT/$r (log $OUT/$r.log)"
  # shellcheck disable=SC2086
  dspark train "${COMMON[@]}" ${ARGS[$r]} --out "$OUT/$r" >"$OUT/$r.log" 2>&1
done
python3 scripts/train/plot_runs.py --out "$OUT/curves.png" \
  $(for r in ${RUNS:-vocab16k control lookmiss}; do echo "$r=$OUT/$r/train_log.jsonl"; done)
