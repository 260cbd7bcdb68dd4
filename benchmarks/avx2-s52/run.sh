# Commands behind every number of this stop (2-core AMD EPYC, AVX2 + FMA, no AVX-512: lscpu.txt).
# Run from the repository root with nothing else running.
D=benchmarks/avx2-s52
# hybrid drafting priced against lookup alone before each drafting step, against the same without (-unpriced)
python3 scripts/bench_lockstep.py --configs plain,default,default-unpriced,lookup-priced-from2,plain-again --concurrency 1 --num-prompts 16 --max-tokens 96 --length-spread 0.5 --repeats 3 --json $D/priced_c1.json > $D/priced_c1.txt
# DSpark alone (no lookup) against the default and lookup alone
python3 scripts/bench_lockstep.py --configs plain,dspark,default,lookup-priced-from2,plain-again --concurrency 1 --num-prompts 16 --max-tokens 96 --length-spread 0.5 --repeats 2 --json $D/alone_c1.json > $D/alone_c1.txt
# decode steps by kind at one request (drafted / looked up), the default against priced lookup alone
python3 $D/step_kinds.py > $D/step_kinds.txt  # before drafted steps were split by lookup's match
# after the drafting steps' own time outside was charged to the drafter (-lumped: as before)
python3 scripts/bench_lockstep.py --configs plain,default,default-lumped,lookup-priced-from2,plain-again --concurrency 1 --num-prompts 16 --max-tokens 96 --length-spread 0.5 --repeats 3 --json $D/split_c1.json > $D/split_c1.txt
python3 $D/step_kinds.py > $D/step_kinds_split.txt
python3 scripts/bench_lockstep.py --configs plain,default,lookup-priced-from2,plain-again --concurrency 1 --num-prompts 16 --max-tokens 96 --length-spread 0.5 --repeats 5 --json $D/hybrid_c1.json > $D/hybrid_c1.txt  # five repeats, the default against lookup alone
python3 scripts/bench_lockstep.py --configs plain,default,default-drafting,lookup-priced-from2,plain-again --concurrency 1 --num-prompts 16 --max-tokens 96 --length-spread 0.5 --repeats 4 --json $D/drafter_gov_c1.json > $D/drafter_gov_c1.txt  # the drafter governor (default) against the drafter always on
python3 scripts/bench_lockstep.py --configs plain,default,lookup-priced-from2,plain-again --concurrency 4 --num-prompts 48 --max-tokens 96 --length-spread 0.5 --repeats 3 --json $D/spread_c4.json > $D/spread_c4.txt  # four requests after this stop's changes
python3 scripts/bench_lockstep.py --configs plain,default,lookup-priced-from2,plain-again --concurrency 1 --num-prompts 16 --max-tokens 96 --length-spread 0.5 --repeats 4 --json $D/letgo_c1.json > $D/letgo_c1.txt  # after letting the drafter go on long backlogs while it is off
# (run with the drafter governor inactive at one request by mistake: default and default-feeding both drafted always)
python3 scripts/bench_lockstep.py --configs plain,default,default-feeding,lookup-priced-from2,plain-again --concurrency 1 --num-prompts 16 --max-tokens 96 --length-spread 0.5 --repeats 4 --json $D/feeding_c1.json > $D/feeding_c1.txt  # letting the drafter go on long backlogs while it is off, against feeding it (-feeding)
# (the same mistake: default drafted always at one request; default-lookup-alone is valid)
python3 scripts/bench_lockstep.py --configs plain,default,default-lookup-alone,lookup-priced-from2,plain-again --concurrency 1 --num-prompts 16 --max-tokens 96 --length-spread 0.5 --repeats 3 --json $D/lookup_alone_c1.json > $D/lookup_alone_c1.txt  # the hybrid held at lookup alone against priced lookup's engine
python3 scripts/bench_lockstep.py --configs plain,default,default-feeding,lookup-priced-from2,plain-again --concurrency 1 --num-prompts 16 --max-tokens 96 --length-spread 0.5 --repeats 4 --json $D/feeding2_c1.json > $D/feeding2_c1.txt  # again, the drafter governor active at every level
python3 scripts/bench_lockstep.py --configs plain,default,lookup-priced-from2,plain-again --concurrency 4 --num-prompts 48 --max-tokens 96 --length-spread 0.5 --repeats 3 --json $D/governed_c4.json > $D/governed_c4.txt  # four requests, lookup alone first at the governed levels
python3 scripts/bench_lockstep.py --configs plain,default,plain-again --concurrency 16 --num-prompts 64 --max-tokens 96 --length-spread 0.5 --repeats 3 --json $D/governed_c16.json > $D/governed_c16.txt  # sixteen requests, lookup alone first at the governed levels
python3 scripts/bench_lockstep.py --configs plain,dspark,plain-again --concurrency 1 --num-prompts 16 --max-tokens 96 --length-spread 0.5 --repeats 3 --json $D/dspark_alone_c1.json > $D/dspark_alone_c1.txt  # the DSpark drafter alone with its drafter governor
python3 scripts/bench_lockstep.py --configs plain,plain-again,plain-b,plain-c --concurrency 4 --num-prompts 32 --max-tokens 96 --length-spread 0.5 --repeats 4 --json $D/lanes_c4.json > $D/lanes_c4.txt  # four plain lanes: does a lane's position in the stepping order bias its time?
python3 benchmarks/avx2-s52/lane_positions.py benchmarks/avx2-s52/lanes_c4.json > benchmarks/avx2-s52/lane_positions_c4.txt
python3 scripts/bench_lockstep.py --configs plain,default,plain-again --concurrency 32 --num-prompts 128 --max-tokens 96 --length-spread 0.5 --repeats 3 --json $D/governed_c32.json > $D/governed_c32.txt  # thirty-two requests after this stop's changes
