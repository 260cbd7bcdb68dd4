#!/usr/bin/env bash
# One drafter-training run in a GPU machine's few minutes: continue a drafter on the
# generated data, calibrate it, and measure its held-out acceptance beside the shipped
# one and prompt lookup.
#
#   bash scripts/gpu_train.sh [OUT_DIR]
#   MINUTES=8 METHOD=dspark INIT=dspark/drafters/shipped/dspark BATCH=32 bash scripts/gpu_train.sh OUT
#   DEVICE=cpu MINUTES=0.5 EVAL=0 bash scripts/gpu_train.sh /tmp/out     # a dry run of the flags
#
# Reads runs/data/{train,heldout}.jsonl when they exist (`dspark data generate`; an
# ignored path: carry runs/data), else the committed datasets/smollm2-135m-instruct/*.jsonl.gz.
# NUM_LAYERS=3 grows the --init drafter by a layer (the A/B of a bigger drafter).
# TRAIN_ARGS adds `dspark train` flags; a fresh drafter with a larger draft vocabulary (the
# shipped one's head has 8,192 rows, covering 94.3 % of held-out response tokens; 16,384
# covers 97.5 %), from the target's last layers with the shipped recipe:
#   INIT=target TRAIN_ARGS="--draft-vocab-size 16384 --block-size 7 --sample-from-anchor
#     --markov-rank 64 --target-layer-ids 1,8,14,20,27,28 --lr 6e-4" bash scripts/gpu_train.sh runs/gpu-v16k
# Installs
# dspark over the machine's own torch (scripts/install.sh keeps an importable one).
# The checkpoint is written to OUT_DIR/<method> every SAVE_MIN minutes, so a run cut
# short still leaves one; the recipe is the shipped drafter's (its config comes with
# --init), at a GPU's batch size.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-runs/gpu}}
MINUTES=${MINUTES:-8}
METHOD=${METHOD:-dspark}
INIT=${INIT:-dspark/drafters/shipped/$METHOD}
DEVICE=${DEVICE:-cuda}
BATCH=${BATCH:-32}
SAVE_MIN=${SAVE_MIN:-2}
EVAL=${EVAL:-1}
NUM_LAYERS=${NUM_LAYERS:-}
mkdir -p "$OUT"
DATA=runs/data/train.jsonl HELDOUT=runs/data/heldout.jsonl
if [ ! -f "$DATA" ]; then DATA=datasets/smollm2-135m-instruct/train.jsonl.gz HELDOUT=datasets/smollm2-135m-instruct/heldout.jsonl.gz; fi
for f in "$DATA" "$HELDOUT"; do
  [ -f "$f" ] || { echo "error: $f is missing (generate it with dspark data generate)" >&2; exit 2; }
done
command -v dspark >/dev/null 2>&1 && python3 -c "import dspark" 2>/dev/null || bash scripts/install.sh
if [ "$DEVICE" = cuda ]; then
  python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device visible to torch')"
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt" || true
fi
export PYTHONUNBUFFERED=1
dspark train --method "$METHOD" --data "$DATA" --eval-data "$HELDOUT" ${NUM_LAYERS:+--num-layers "$NUM_LAYERS"} \
  --batch-size "$BATCH" --position-decay 2 --blocks-per-seq 64 --no-progress --log-every 20 \
  --dtype bf16 --device "$DEVICE" --init "$INIT" --lr 3e-4 --max-steps 1000000 \
  --time-limit-min "$MINUTES" --save-every-min "$SAVE_MIN" --out "$OUT/$METHOD" ${TRAIN_ARGS:-} 2>&1 \
  | tee "$OUT/train-$METHOD.log"
if [ "$METHOD" = dspark ]; then
  dspark calibrate --drafter "$OUT/$METHOD" --data "$HELDOUT" --device "$DEVICE" 2>&1 \
    | tee "$OUT/calibrate.log"
fi
if [ "$EVAL" = 1 ]; then
  BASE=$INIT; [ -d "$BASE" ] || BASE=dspark/drafters/shipped/$METHOD  # INIT=target/random: against the shipped
  dspark eval acceptance --drafter "$OUT/$METHOD" --drafter "$BASE" --drafter ngram --block 7 \
    --domains math,code,chat --num-prompts 10 --max-tokens 128 --max-num-seqs 10 --device "$DEVICE" --json \
    > "$OUT/acceptance.json" 2> "$OUT/acceptance.log"
  tail -n 20 "$OUT/acceptance.log" || true
fi
echo "wrote $OUT/$METHOD (checkpoint), $OUT/train-$METHOD.log"
