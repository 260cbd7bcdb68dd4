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
