# Commands behind every number of this stop (2-core AMD EPYC, AVX2 + FMA, no AVX-512: lscpu.txt).
# Run from the repository root with nothing else running.
D=benchmarks/avx2-s53
# steps that draft nothing: the DSpark drafter alone held off (its context kept) and the default held in plain mode
python3 scripts/bench_lockstep.py --configs plain,dspark-off,default-held-plain,plain-again --concurrency 1 --num-prompts 16 --max-tokens 96 --length-spread 0.5 --repeats 4 --json $D/off_c1.json > $D/off_c1.txt
python3 $D/outside_profile.py plain,dspark-off,default-held-plain 600 ours  # where their time outside the target goes (cProfile; not kept)
# thirty-two requests: the default, and held in plain mode (its machinery alone)
python3 scripts/bench_lockstep.py --configs plain,default,default-held-plain,plain-again --concurrency 32 --num-prompts 128 --max-tokens 96 --length-spread 0.5 --repeats 4 --json $D/held_c32.json > $D/held_c32.txt
# lookup alone first at every level (the working tree before the yield bound of c33921e) against the drafter first, one request
python3 $D/first_trial.py > $D/first_trial.txt  # one trial of the drafter governor, logged
python3 scripts/bench_lockstep.py --configs plain,default,default-drafter-first,lookup-priced-from2,plain-again --concurrency 1 --num-prompts 16 --max-tokens 96 --length-spread 0.5 --repeats 5 --json $D/off_first_c1.json > $D/off_first_c1.txt
# with the yield bound (c33921e)
python3 scripts/bench_lockstep.py --configs plain,default,default-drafter-first,lookup-priced-from2,plain-again --concurrency 1 --num-prompts 16 --max-tokens 96 --length-spread 0.5 --repeats 5 --json $D/yield_c1.json > $D/yield_c1.txt
# the hybrid held at lookup alone, with and without the drafter's taps and context, against priced lookup's engine
python3 scripts/bench_lockstep.py --configs plain,default-lookup-alone,default-lookup-alone-untapped,lookup-priced-from2,plain-again --concurrency 1 --num-prompts 16 --max-tokens 96 --length-spread 0.5 --repeats 5 --json $D/untapped_c1.json > $D/untapped_c1.txt
# four and sixteen requests with this stop's code
python3 scripts/bench_lockstep.py --configs plain,default,lookup-priced-from2,plain-again --concurrency 4 --num-prompts 48 --max-tokens 96 --length-spread 0.5 --repeats 4 --json $D/final_c4.json > $D/final_c4.txt
python3 scripts/bench_lockstep.py --configs plain,default,plain-again --concurrency 16 --num-prompts 64 --max-tokens 96 --length-spread 0.5 --repeats 3 --json $D/final_c16.json > $D/final_c16.txt
python3 scripts/bench_lockstep.py --configs plain,default,plain-again --concurrency 32 --num-prompts 128 --max-tokens 96 --length-spread 0.5 --repeats 3 --json $D/final_c32.json > $D/final_c32.txt  # thirty-two requests with this stop's code
python3 scripts/bench_lockstep.py --configs plain,default,lookup-priced-from2,plain-again --concurrency 1 --num-prompts 16 --max-tokens 96 --length-spread 0.5 --repeats 8 --json $D/final_c1.json > $D/final_c1.txt  # one request, eight repeats, the default against priced lookup alone
