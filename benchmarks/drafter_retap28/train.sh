cd /work/main
dspark train --method dspark --data datasets/smollm2-135m-instruct/train.jsonl.gz \
  --eval-data datasets/smollm2-135m-instruct/heldout.jsonl.gz --feature-cache runs/feature-cache-28 \
  --batch-size 4 --position-decay 2 --blocks-per-seq 64 --no-progress --dtype bf16 \
  --init dspark/drafters/shipped/dspark --target-layer-ids 1,8,14,20,27,28 \
  --lr 3e-4 --max-steps 1200 --save-every 200 --threads 2 --out runs/train/retap28
