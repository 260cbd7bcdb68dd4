#!/bin/sh
# Issue 24, session 57, AMX Xeon (lscpu.txt). Run from the repository root, nothing else running.
D=benchmarks/amx-s57
# 0. the shipped DSpark's taps moved 29 -> 28 and continued (benchmarks/drafter_retap28/train.sh), then
dspark calibrate --drafter runs/train/retap28 --data datasets/smollm2-135m-instruct/heldout.jsonl.gz
dspark eval acceptance --drafter runs/train/retap28 --drafter /tmp/shipped-dspark-old --drafter ngram --block 7 \
  --domains math,code,chat --num-prompts 10 --max-tokens 128 --max-num-seqs 10 --json > $D/eval_retap28.json
# (after copying it into dspark/drafters/shipped/dspark; /tmp/shipped-dspark-old = the drafter at 4334244)
python3 scripts/peer_llama_cpp.py --methods dspark --num-prompts 12 --max-tokens 64 --work runs/llama_cpp_retap \
  --json $D/llama_interop_dspark.json
# 1. served, against llama.cpp plain, ngram-simple and draft-dspark with the shipped drafter (report: peers/sweep.md)
sh $D/peers.sh > $D/peers.log 2>&1
# 2. one request, engines stepped in turn: the default and DSpark alone with the moved drafter against
#    the same with the previous one (taps to 29)
python3 scripts/bench_lockstep.py --configs plain,default,default-prev,dspark,dspark-prev,plain-again --concurrency 1 --num-prompts 16 --max-tokens 96 --length-spread 0.5 --repeats 6 --config 'default-prev={"method": "dspark", "model": "/tmp/shipped-dspark-old", "enable_adaptive_verification": true, "lookup": true, "plain_fallback": 8, "plain_trials_from": 2, "lookup_history": true}' --config 'dspark-prev={"method": "dspark", "model": "/tmp/shipped-dspark-old", "enable_adaptive_verification": true, "plain_fallback": 8, "plain_trials_from": 2}' --json $D/c1_drafters.json > $D/c1_drafters.txt
# 3. DSpark alone at one request: the moved drafter with its own calibration, with the previous drafter's STS temperatures, uncalibrated, and the previous drafter
python3 scripts/bench_lockstep.py --configs plain,dspark,dspark-oldcal,dspark-raw,dspark-prev,plain-again --concurrency 1 --num-prompts 16 --max-tokens 96 --length-spread 0.5 --repeats 6 --config 'dspark-oldcal={"method": "dspark", "model": "/tmp/new-oldcal", "enable_adaptive_verification": true, "plain_fallback": 8, "plain_trials_from": 2}' --config 'dspark-raw={"method": "dspark", "model": "/tmp/new-raw", "enable_adaptive_verification": true, "plain_fallback": 8, "plain_trials_from": 2}' --config 'dspark-prev={"method": "dspark", "model": "/tmp/shipped-dspark-old", "enable_adaptive_verification": true, "plain_fallback": 8, "plain_trials_from": 2}' --json $D/c1_calibration.json > $D/c1_calibration.txt 2>&1
# 4. the default at four requests: the moved drafter with its own STS temperatures, with the previous drafter's, and the previous drafter
python3 scripts/bench_lockstep.py --configs plain,default,default-oldcal,default-prev,plain-again --concurrency 4 --num-prompts 48 --max-tokens 96 --length-spread 0.5 --repeats 5 --config 'default-oldcal={"method": "dspark", "model": "/tmp/new-oldcal", "enable_adaptive_verification": true, "lookup": true, "plain_fallback": 8, "plain_trials_from": 2, "lookup_history": true}' --config 'default-prev={"method": "dspark", "model": "/tmp/shipped-dspark-old", "enable_adaptive_verification": true, "lookup": true, "plain_fallback": 8, "plain_trials_from": 2, "lookup_history": true}' --json $D/c4_calibration.json > $D/c4_calibration.txt 2>&1
# 5. the default at one request as shipped (the moved drafter, the previous temperatures) against the previous drafter
python3 scripts/bench_lockstep.py --configs plain,default,default-prev,plain-again --concurrency 1 --num-prompts 16 --max-tokens 96 --length-spread 0.5 --repeats 4 --config 'default-prev={"method": "dspark", "model": "/tmp/shipped-dspark-old", "enable_adaptive_verification": true, "lookup": true, "plain_fallback": 8, "plain_trials_from": 2, "lookup_history": true}' --json $D/c1_shipped.json > $D/c1_shipped.txt 2>&1
