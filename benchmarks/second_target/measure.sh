#!/usr/bin/env bash
# The second target's journey measured on a quiet machine (nothing else running), and the
# continued default drafter's evaluation. Writes into runs/measure-s30/.
#   measure.sh accuracy   acceptance and exactness (no timing: may run beside other work)
#   measure.sh timing     start-up, kernels, step-time curves, sweeps (a quiet machine only)
set -uo pipefail
cd "$(dirname "$0")/../.."
Q=${Q:-$(scripts/fetch_qwen_coder.sh)}  # the run itself used a copy in /tmp/qc
QD=${QD:-runs/qwen/train/dspark}
D=${D:-runs/train/dspark-D}
M=runs/measure-s30
mkdir -p $M
lscpu > $M/lscpu.txt
step() { echo "== $(date +%T) $*" | tee -a $M/steps.log; }

PART=${1:-all}
if [ $PART != timing ]; then
step "calibrate the second target's drafter"
dspark calibrate --drafter $QD --data runs/qwen/heldout.jsonl --model $Q > $M/calibrate-Q.log 2>&1
step "eval acceptance on the second target: its DSpark drafter, ngram"
dspark eval acceptance --model $Q --drafter $QD --drafter ngram --block 7 --domains math,code,chat \
  --num-prompts 6 --max-tokens 128 --max-num-seqs 6 --json --plot $M/acc-Q.png > $M/eval-Q.jsonl 2> $M/eval-Q.err
step "exactness on the second target with its trained drafter"
python3 scripts/check_second_target.py $Q --drafter $QD --max-tokens 48 --threads 2 > $M/exact-Q.log 2>&1
step "export the second target's drafter for llama.cpp"
dspark export --to llama.cpp $QD $M/qwen-dspark-llama.cpp --model $Q > $M/export-Q.log 2>&1
# (the continued drafter's training must have finished: wait for it when it runs here)
[ -f runs/logs/train-D.pid ] && while kill -0 "$(cat runs/logs/train-D.pid)" 2>/dev/null; do sleep 10; done
step "calibrate the continued default drafter"
dspark calibrate --drafter $D --data runs/data/heldout.jsonl > $M/calibrate-D.log 2>&1
step "eval acceptance: continued, shipped, ngram"
dspark eval acceptance --drafter $D --drafter dspark/drafters/shipped/dspark --drafter ngram --block 7 \
  --domains math,code,chat --num-prompts 10 --max-tokens 128 --max-num-seqs 10 --json --plot $M/acc-D.png \
  > $M/eval-D.jsonl 2> $M/eval-D.err
fi
if [ $PART != accuracy ]; then
step "start-up: import torch against a one-token generate, interleaved, warm caches"
for model in default $Q; do dspark generate hi --model $model --max-tokens 1 --speculative-config none >/dev/null 2>&1; done
for r in 1 2 3 4 5; do
  T="/usr/bin/time -a -o $M/startup.txt -f"
  $T "import_torch %e" python3 -c 'import torch'
  $T "generate_default %e" dspark generate hi --max-tokens 1 --speculative-config none >/dev/null 2>&1
  $T "generate_second %e" dspark generate hi --model $Q --max-tokens 1 --speculative-config none >/dev/null 2>&1
done
step "kernel micro-benchmark"
python3 scripts/bench_gemm_isa.py --threads 2 --rounds 5 --json $M/gemm_isa.json > $M/gemm_isa.txt 2>&1
step "step-time curves"
dspark profile --model $Q --force --max-tokens 16 --json > $M/profile-Q.json 2> $M/profile-Q.err
for r in 1; do  # the bf16w matmul's AVX-512 variant against its AVX2 one, alternating
  dspark profile --dtype bf16w --force --max-tokens 16 --json --out $M/profile-default-avx512-$r.json > /dev/null 2>> $M/profile.err
  DSPARK_GEMM_ISA=avx2 dspark profile --dtype bf16w --force --max-tokens 16 --json --out $M/profile-default-avx2-$r.json > /dev/null 2>> $M/profile.err
done
step "sweep on the second target"
dspark bench sweep --out $M/sweep-Q --configs none \
  "hybrid={\"method\":\"dspark\",\"model\":\"$QD\",\"lookup\":true,\"enable_adaptive_verification\":true}" \
  --server-args "--model $Q" --concurrency 1,16 --rounds 2 --max-tokens 48 --dataset mixed --ignore-eos \
  --num-prompts 16 --reference none --disable-tqdm > $M/sweep-Q.log 2>&1
step "sweep on the default model: plain against hybrid with the continued drafter"
dspark bench sweep --out $M/sweep-default --configs none \
  "hybrid-D={\"method\":\"dspark\",\"model\":\"$D\",\"lookup\":true,\"enable_adaptive_verification\":true}" \
  --concurrency 1,16 --rounds 2 --max-tokens 64 --dataset mixed --ignore-eos \
  --num-prompts 16 --reference none --disable-tqdm > $M/sweep-default.log 2>&1
fi
step "done $PART"
