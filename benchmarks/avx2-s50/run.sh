#!/bin/sh
# This directory's numbers (2-core AMD EPYC, AVX2+FMA, no AVX-512: lscpu.txt), nothing else running.
cd "$(dirname "$0")/../.."
D=benchmarks/avx2-s50
# where a step's time outside the target goes, plain decoding against the default, split by drafting
python3 $D/step_split.py > $D/step_split.txt
# the weights' prefetch hint T0 against NTA (NTA built by hand into a cache dir of its own; see nta_prefetch_ab.txt)
# the lookup-only step in plain Python (this tree) against the tensor path (b01f0fe), paired
python3 $D/ab.py --configs plain,default,default@b01f0fe,plain-again > $D/lookup_lists_ab.txt
python3 scripts/bench_round_phases.py --configs plain,default --prompts 6 --max-tokens 128 --json $D/phases_c1.json > $D/phases_c1.txt
python3 scripts/bench_lockstep.py --configs plain,default,plain-again --concurrency 1 --num-prompts 16 --max-tokens 96 --repeats 3 --json $D/lockstep_c1.json > $D/lockstep_c1.txt
python3 scripts/bench_lockstep.py --configs plain,default,plain-again --concurrency 4 --num-prompts 48 --max-tokens 96 --repeats 2 --json $D/lockstep_c4.json > $D/lockstep_c4.txt
python3 $D/gemm_rows.py > $D/gemm_rows.txt
python3 scripts/bench_draft_ab.py --before HEAD --trials 10 > $D/draft_warm.txt
# after DSparkAsync.choose in plain Python and greedy verification without the draft logits (8abcc7e)
python3 $D/step_split.py > $D/step_split_after_choose.txt
python3 $D/step_split.py 12 4 > $D/step_split_c4.txt
sh $D/served_c1.sh > $D/served_c1.log
python3 scripts/bench_lockstep.py --configs plain,default,lookup,dspark,plain-again --concurrency 1 --num-prompts 16 --max-tokens 96 --repeats 2 --json $D/hybrid_c1.json > $D/hybrid_c1.txt
python3 scripts/bench_lockstep.py --configs plain,default,lookup3,lookup-priced,plain-again --concurrency 1 --num-prompts 16 --max-tokens 96 --repeats 2 --json $D/hybrid_c1_lookup3.json > $D/hybrid_c1_lookup3.txt
