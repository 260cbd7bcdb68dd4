# Commands behind every number of this stop (2-core Intel Xeon with AMX and avx512_bf16: lscpu.txt;
# `auto` picks bf16x). Run from the repository root with nothing else running.
D=benchmarks/amx-s54
# one request: the default against plain decoding, the DSpark drafter alone and priced lookup alone
python3 scripts/bench_lockstep.py --configs plain,default,dspark,lookup-priced-from2,plain-again --concurrency 1 --num-prompts 16 --max-tokens 96 --length-spread 0.5 --repeats 5 --json $D/c1.json > $D/c1.txt
# `auto` flips between bf16w and bf16x from start to start here (prec.txt); both precisions stepped in turn
python3 scripts/bench_lockstep.py --dtype bf16w --configs plain,plain@bf16x,default,default@bf16x,plain-again --concurrency 1 --num-prompts 16 --max-tokens 96 --length-spread 0.5 --repeats 5 --json $D/prec_c1.json > $D/prec_c1.txt
