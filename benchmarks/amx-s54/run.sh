# Commands behind every number of this stop (2-core Intel Xeon with AMX and avx512_bf16: lscpu.txt;
# `auto` picks bf16x). Run from the repository root with nothing else running.
D=benchmarks/amx-s54
# one request: the default against plain decoding, the DSpark drafter alone and priced lookup alone
python3 scripts/bench_lockstep.py --configs plain,default,dspark,lookup-priced-from2,plain-again --concurrency 1 --num-prompts 16 --max-tokens 96 --length-spread 0.5 --repeats 5 --json $D/c1.json > $D/c1.txt
# `auto` flips between bf16w and bf16x from start to start here (prec.txt); both precisions stepped in turn
python3 scripts/bench_lockstep.py --dtype bf16w --configs plain,plain@bf16x,default,default@bf16x,plain-again --concurrency 1 --num-prompts 16 --max-tokens 96 --length-spread 0.5 --repeats 5 --json $D/prec_c1.json > $D/prec_c1.txt
python3 $D/auto_picks.py  # four measurements in one process (at 78d23cf: the old rule; the first four lines of auto_picks.txt)
python3 $D/auto_once.py 4  # one measurement in a fresh process (the new rule), four times
python3 $D/matmul_rows.py > $D/matmul_rows.txt  # 1/8/32-row products per weight, bf16w and bf16x, 12 runs each
python3 $D/step_times.py > $D/step_times.txt  # the target's step time by token count, both precisions, two passes
# with auto = bf16x (after the change): four, sixteen and thirty-two requests; bf16w lanes beside
python3 scripts/bench_lockstep.py --configs plain,default,lookup-priced-from2,plain@bf16w,plain-again --concurrency 4 --num-prompts 48 --max-tokens 96 --length-spread 0.5 --repeats 5 --json $D/c4.json > $D/c4.txt
python3 scripts/bench_lockstep.py --configs plain,default,plain@bf16w,default@bf16w,plain-again --concurrency 16 --num-prompts 64 --max-tokens 96 --length-spread 0.5 --repeats 5 --json $D/c16.json > $D/c16.txt
python3 scripts/bench_lockstep.py --configs plain,default,plain@bf16w,default@bf16w,plain-again --concurrency 32 --num-prompts 128 --max-tokens 96 --length-spread 0.5 --repeats 5 --json $D/c32.json > $D/c32.txt
# one request with auto = bf16x: the default against the DSpark drafter alone and priced lookup alone
python3 scripts/bench_lockstep.py --configs plain,default,dspark,lookup-priced-from2,plain-again --concurrency 1 --num-prompts 16 --max-tokens 96 --length-spread 0.5 --repeats 5 --json $D/c1_bf16x.json > $D/c1_bf16x.txt
# sixteen requests: would speculation the fallback holds off pay here? (`hybrid`: the default's drafting, never governed)
python3 scripts/bench_lockstep.py --configs plain,default,hybrid,plain-again --concurrency 16 --num-prompts 64 --max-tokens 96 --length-spread 0.5 --repeats 4 --json $D/ungoverned_c16.json > $D/ungoverned_c16.txt
sh benchmarks/amx-s54/served.sh  # served, both servers up, rounds alternating: c1/4/16/32
# thirty-two requests again: the default, and held in plain mode (its machinery alone, no tail speculation)
python3 scripts/bench_lockstep.py --configs plain,default,default-held-plain,plain-again --concurrency 32 --num-prompts 128 --max-tokens 96 --length-spread 0.5 --repeats 4 --json $D/held_c32.json > $D/held_c32.txt
