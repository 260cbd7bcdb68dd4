#!/bin/sh
# This directory's numbers (2-core AMD EPYC, AVX2+FMA, no AVX-512: lscpu.txt), nothing else running.
cd "$(dirname "$0")/../.."
D=benchmarks/avx2-s49
python3 scripts/bench_round_phases.py --configs plain,default,ngram,dspark-1 --prompts 6 --max-tokens 128 --json $D/phases_c1.json
python3 scripts/bench_lockstep.py --configs plain,default,lookup,dspark,plain-again --concurrency 1 --num-prompts 16 --max-tokens 96 --repeats 2 --json $D/lockstep_c1.json
python3 scripts/bench_lockstep.py --configs plain,default,lookup3,plain-again --concurrency 1 --num-prompts 16 --max-tokens 96 --repeats 2 --json $D/lockstep_c1_lookup3.json
python3 scripts/bench_lockstep.py --configs plain,lookup3,lookup-priced,default,plain-again --concurrency 1 --num-prompts 16 --max-tokens 96 --repeats 2 --json $D/priced_c1.json
python3 scripts/bench_lockstep.py --configs plain,lookup3-governed-from2,lookup-priced,lookup3,plain-again --concurrency 4 --num-prompts 32 --max-tokens 96 --repeats 1 --json $D/priced_c4.json
python3 $D/priced_diag.py
python3 $D/step_bookkeeping.py
python3 $D/gate_ab.py --configs plain,lookup3-gated,default-gated,default
python3 $D/gate_ab.py
python3 $D/gate_ab.py --model $(ls -d ~/.cache/dspark/models/qwen2.5-coder-0.5b-instruct-*) --prompts 8 --rounds 1
python3 $D/gate_ab.py --configs plain,lookup3-gated,priced-gated,priced
python3 scripts/bench_lockstep.py --configs plain,default,default-gated,plain-again --concurrency 2 --num-prompts 24 --max-tokens 96 --repeats 2 --json $D/gate_c2.json
sh $D/served_c1.sh
python3 $D/flush_cost.py
python3 scripts/bench_lockstep.py --configs plain,default,plain-again --concurrency 4 --num-prompts 48 --max-tokens 96 --repeats 2 --json $D/lockstep_c4.json
python3 $D/step_bookkeeping.py 4 > $D/step_bookkeeping_c4.txt
python3 scripts/bench_lockstep.py --configs plain,default,plain-again --concurrency 1 --num-prompts 16 --max-tokens 96 --repeats 3 --json $D/lockstep_c1_final.json
python3 scripts/bench_lockstep.py --configs plain,default,default-plain-from4,plain-again --concurrency 4 --num-prompts 48 --max-tokens 96 --repeats 2 --json $D/plain_from4_c4.json
