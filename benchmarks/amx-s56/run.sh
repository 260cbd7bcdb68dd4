#!/bin/sh
# Issue 24, session 56, AMX Xeon (lscpu.txt). Run from the repository root, nothing else running.
D=benchmarks/amx-s56
P=~/.cache/dspark/profiles/SmolLM2-135M-Instruct-bf16x-cpu-055afb0038-64.json
# 1. four requests with the step-time table whose T(8)/T(4) reads 1.208 (last session's
#    table_new: the governor's dear-verification prior starts the 4-7 level plain):
#    this tree against f6d5feb (the 4x first gap), each with its own A/A
cp benchmarks/amx-s55/table_new.json $P
PYTHONPATH=. python3 scripts/bench_lockstep.py --configs plain,default,plain-again --concurrency 4 --num-prompts 48 --max-tokens 96 --length-spread 0.5 --repeats 3 --json $D/c4_dear_new.json > $D/c4_dear_new.txt
(cd /tmp/old && PYTHONPATH=/tmp/old python3 scripts/bench_lockstep.py --configs plain,default,plain-again --concurrency 4 --num-prompts 48 --max-tokens 96 --length-spread 0.5 --repeats 3 --json $OLDPWD/$D/c4_dear_old.json > $OLDPWD/$D/c4_dear_old.txt)
cp $D/table_current_build.json $P
# 2. the same with this build's own table (T(8)/T(4) 1.057: the 4-7 level starts speculating either way)
PYTHONPATH=. python3 scripts/bench_lockstep.py --configs plain,default,plain-again --concurrency 4 --num-prompts 48 --max-tokens 96 --length-spread 0.5 --repeats 3 --json $D/c4_own_table.json > $D/c4_own_table.txt
# 3. one request: where the hybrid with its drafter on stands against the drafter alone and lookup alone
python3 scripts/bench_lockstep.py --configs plain,default-drafting,dspark,lookup-priced-from2,default,plain-again --concurrency 1 --num-prompts 16 --max-tokens 96 --length-spread 0.5 --repeats 3 --json $D/c1_sources.json > $D/c1_sources.txt
python3 benchmarks/amx-s56/draft_floor.py > $D/draft_floor.txt   # 4. a draft against its weights' read
# 5. lookup tables fitted on the same greedy replies, n-grams up to 3 and up to 5
dspark calibrate-lookup --out $D/lookup_max3.json --prompt-lookup-max 3
dspark calibrate-lookup --out $D/lookup_max5.json --prompt-lookup-max 5
# 6. one request: lookup up to 5-grams (its own table) against up to 3, alone and in the default
python3 scripts/bench_lockstep.py --configs plain,lookup-priced,lookup5,default,default5,plain-again --concurrency 1 --num-prompts 16 --max-tokens 96 --length-spread 0.5 --repeats 6 --config 'lookup5={"method": "ngram", "enable_adaptive_verification": true, "prompt_lookup_max": 5, "lookup_calibration": "benchmarks/amx-s56/lookup_max5.json"}' --config 'default5={"method": "dspark", "enable_adaptive_verification": true, "lookup": true, "plain_fallback": 8, "plain_trials_from": 2, "prompt_lookup_max": 5, "lookup_calibration": "benchmarks/amx-s56/lookup_max5.json"}' --json benchmarks/amx-s56/c1_ngram5.json > benchmarks/amx-s56/c1_ngram5.txt
# (stopped after 4 repeats: the 4th ran beside other work, half speed; repeats 1-3 are the result)
# 7. one request: lookup in 1,000 earlier replies (the default model's, training split) beside the request's own
python3 scripts/bench_lockstep.py --configs plain,lookup-priced,lookuph,default,defaulth,plain-again --concurrency 1 --num-prompts 16 --max-tokens 96 --length-spread 0.5 --repeats 6 --warm-history 1000 --config 'lookuph={"method": "ngram", "enable_adaptive_verification": true, "lookup_history": true}' --config 'defaulth={"method": "dspark", "enable_adaptive_verification": true, "lookup": true, "plain_fallback": 8, "plain_trials_from": 2, "lookup_history": true}' --json benchmarks/amx-s56/c1_history.json > benchmarks/amx-s56/c1_history.txt
# 8. four requests, the history warm
python3 scripts/bench_lockstep.py --configs plain,default,defaulth,plain-again --concurrency 4 --num-prompts 48 --max-tokens 96 --length-spread 0.5 --repeats 4 --warm-history 1000 --config 'defaulth={"method": "dspark", "enable_adaptive_verification": true, "lookup": true, "plain_fallback": 8, "plain_trials_from": 2, "lookup_history": true}' --json benchmarks/amx-s56/c4_history.json > benchmarks/amx-s56/c4_history.txt
# 9. one request, the history cold (it fills from the run's own 48 replies)
python3 scripts/bench_lockstep.py --configs plain,default,defaulth,plain-again --concurrency 1 --num-prompts 48 --max-tokens 96 --length-spread 0.5 --repeats 4 --config 'defaulth={"method": "dspark", "enable_adaptive_verification": true, "lookup": true, "plain_fallback": 8, "plain_trials_from": 2, "lookup_history": true}' --json benchmarks/amx-s56/c1_history_cold.json > benchmarks/amx-s56/c1_history_cold.txt
# 10. sixteen requests, the history warm
python3 scripts/bench_lockstep.py --configs plain,default,defaulth,plain-again --concurrency 16 --num-prompts 64 --max-tokens 96 --length-spread 0.5 --repeats 4 --warm-history 1000 --config 'defaulth={"method": "dspark", "enable_adaptive_verification": true, "lookup": true, "plain_fallback": 8, "plain_trials_from": 2, "lookup_history": true}' --json benchmarks/amx-s56/c16_history.json > benchmarks/amx-s56/c16_history.txt
# 11. thirty-two requests, the history warm (the default now has it; default-no-history is the one before)
python3 scripts/bench_lockstep.py --configs plain,default-no-history,default,plain-again --concurrency 32 --num-prompts 96 --max-tokens 96 --length-spread 0.5 --repeats 4 --warm-history 1000 --json benchmarks/amx-s56/c32_history.json > benchmarks/amx-s56/c32_history.txt
# 12. served: the default (history empty at start) against none and a second none
sh benchmarks/amx-s56/served.sh
