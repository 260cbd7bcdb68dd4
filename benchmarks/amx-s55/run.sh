# Commands behind every number of this stop (2-core Intel Xeon with AMX and avx512_bf16: lscpu.txt;
# `auto` picks bf16x). Run from the repository root with nothing else running.
D=benchmarks/amx-s55
# served beside llama.cpp (build 11434, bf16 GGUF): 3 rounds, all servers up (at 87fb11c)
bash scripts/install_llama_cpp.sh && python3 scripts/peer_llama_cpp.py --methods dflash --num-prompts 4 --max-tokens 32 --json $D/llama_interop_dflash.json
sh $D/peers.sh
# a drafting round by phase at one request (before the changes: phases_c1.json, at 87fb11c; after: phases_c1_after.json)
python3 scripts/bench_round_phases.py --configs plain,dspark-3,default-no-lookup,ngram --prompts 6 --max-tokens 96 --json $D/phases_c1.json
python3 scripts/bench_round_phases.py --configs plain,dspark-3,default-no-lookup,ngram --prompts 6 --max-tokens 96 --json $D/phases_c1_after.json
# the draft call of the session's start (356707d) against the working tree, replayed alternately on one drafter state
python3 scripts/bench_draft_ab.py --before 356707d --trials 60 --requests 4 > $D/draft_ab_c4.txt
# the top-64 selection alone, native against torch, on a draft's logits
python3 $D/topk_rows.py > $D/topk_rows.txt
# engine alone, stepped in turn: one, four and thirty-two requests
python3 scripts/bench_lockstep.py --configs plain,default,dspark,lookup-priced-from2,plain-again --concurrency 1 --num-prompts 16 --max-tokens 96 --length-spread 0.5 --repeats 5 --json $D/c1.json > $D/c1.txt
python3 scripts/bench_lockstep.py --configs plain,default,dspark,lookup-priced-from2,plain-again --concurrency 4 --num-prompts 48 --max-tokens 96 --length-spread 0.5 --repeats 5 --json $D/c4.json > $D/c4.txt
python3 scripts/bench_lockstep.py --configs plain,default,default-held-plain,plain-again --concurrency 32 --num-prompts 128 --max-tokens 96 --length-spread 0.5 --repeats 4 --json $D/c32.json > $D/c32.txt
# four requests, the session's first revision against the working tree, each with the step-time table it
# measured itself (the first revision's re-measured: its cached table deleted), then the first revision with
# the working tree's table (copied over its own cache file): table_356707d.json, table_new.json
git clone -q . /tmp/old && (cd /tmp/old && git checkout -q 356707d)
rm -f ~/.cache/dspark/profiles/*fcb30c5c43*
(cd /tmp/old && PYTHONPATH=/tmp/old python3 scripts/bench_lockstep.py --configs plain,default,plain-again --concurrency 4 --num-prompts 48 --max-tokens 96 --length-spread 0.5 --repeats 3 --json $OLDPWD/$D/c4_at_356707d.json > $OLDPWD/$D/c4_at_356707d.txt)
python3 scripts/bench_lockstep.py --configs plain,default,plain-again --concurrency 4 --num-prompts 48 --max-tokens 96 --length-spread 0.5 --repeats 3 --json $D/c4_new.json > $D/c4_new.txt
cp ~/.cache/dspark/profiles/SmolLM2-135M-Instruct-bf16x-cpu-508f536ca9-64.json ~/.cache/dspark/profiles/SmolLM2-135M-Instruct-bf16x-cpu-fcb30c5c43-64.json
(cd /tmp/old && PYTHONPATH=/tmp/old python3 scripts/bench_lockstep.py --configs plain,default,plain-again --concurrency 4 --num-prompts 48 --max-tokens 96 --length-spread 0.5 --repeats 3 > $OLDPWD/$D/c4_at_356707d_with_new_table.txt)
