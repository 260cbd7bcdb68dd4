#!/bin/sh
# This directory's numbers (2-core AMD EPYC, AVX2+FMA, no AVX-512: lscpu.txt), nothing else running.
cd "$(dirname "$0")/../.."
D=benchmarks/avx2-s51
M=$(ls -d ~/.cache/dspark/models/qwen2.5-coder-0.5b-instruct-*)
# before the paired trials (at e9d4c0b): priced lookup against the fixed 3 tokens, 4 requests
python3 scripts/bench_lockstep.py --configs plain,lookup3-governed-from2,lookup-priced-from2,plain-again --concurrency 4 --num-prompts 48 --max-tokens 96 --repeats 3 --json $D/priced_c4.json > $D/priced_c4.txt
# per-step traces, governed engine against plain decoding stepped in turn (at e9d4c0b: runs scored one after the other)
for i in 1 2 3 4; do python3 $D/governor_trace.py lookup-priced-from2 4 48 /tmp/trace_priced_c4_$i.jsonl; done
python3 $D/trace_report.py /tmp/trace_priced_c4_*.jsonl > $D/trace_priced_c4_sequential.txt
# after (4c59eb7 and on): paired trials
python3 scripts/bench_lockstep.py --configs plain,lookup3-governed-from2,lookup-priced-from2,default,plain-again --concurrency 4 --num-prompts 48 --max-tokens 96 --repeats 3 --json $D/paired_c4.json > $D/paired_c4.txt
python3 $D/governor_trace.py default 4 48 /tmp/trace_default_c4.jsonl && python3 $D/trace_report.py /tmp/trace_default_c4.jsonl > $D/trace_default_c4_paired.txt
for c in default lookup-priced-from2; do python3 scripts/bench_lockstep.py --configs plain,$c --concurrency 4 --num-prompts 48 --max-tokens 96 --repeats 4 --json $D/pair_c4_$c.json > $D/pair_c4_$c.txt; done
python3 scripts/bench_lockstep.py --configs plain,lookup3-governed-from2,lookup-priced-from2,default,plain-again --concurrency 16 --num-prompts 64 --max-tokens 96 --repeats 3 --json $D/paired_c16.json > $D/paired_c16.txt
# requests of different lengths (--length-spread 0.5: 48 to 144 tokens)
python3 scripts/bench_lockstep.py --configs plain,default,lookup-priced-from2,plain-again --concurrency 4 --num-prompts 48 --max-tokens 96 --length-spread 0.5 --repeats 3 --json $D/spread_c4.json > $D/spread_c4.txt
python3 scripts/bench_lockstep.py --configs plain,lookup3-governed-from2,lookup-priced-from2,plain-again --concurrency 4 --num-prompts 48 --max-tokens 96 --length-spread 0.5 --repeats 3 --json $D/spread_c4_lookup.json > $D/spread_c4_lookup.txt
python3 scripts/bench_lockstep.py --configs plain,default-held-plain,plain-again --concurrency 4 --num-prompts 48 --max-tokens 96 --length-spread 0.5 --repeats 3 --json $D/held_plain_c4.json > $D/held_plain_c4.txt
for i in 1 2 3; do python3 $D/governor_trace.py lookup3-governed-from2 4 48 /tmp/tr_l3_spread_$i.jsonl default 0.5; done
python3 $D/trace_report.py /tmp/tr_l3_spread_*.jsonl > $D/trace_lookup3_spread_c4.txt
for i in 1 2; do python3 $D/governor_trace.py lookup-priced-from2 4 48 /tmp/tr_pr_spread_$i.jsonl default 0.5; done
python3 $D/trace_report.py /tmp/tr_pr_spread_*.jsonl > $D/trace_priced_spread_c4.txt
# the second target, priced lookup against the fixed 3 tokens
python3 scripts/bench_lockstep.py --model $M --configs plain,lookup3-governed-from2,lookup-priced-from2,plain-again --concurrency 1 --num-prompts 12 --max-tokens 96 --repeats 2 --json $D/qwen_priced_c1.json > $D/qwen_priced_c1.txt
python3 scripts/bench_lockstep.py --model $M --configs plain,lookup3-governed-from2,lookup-priced-from2,plain-again --concurrency 4 --num-prompts 24 --max-tokens 96 --repeats 2 --json $D/qwen_priced_c4.json > $D/qwen_priced_c4.txt
python3 $D/profile_time.py > $D/profile_time.txt
python3 scripts/bench_lockstep.py --configs plain,lookup3-governed-from2,lookup-priced-from2,default,plain-again --concurrency 4 --num-prompts 48 --max-tokens 96 --length-spread 0.5 --repeats 3 --json $D/bound_spread_c4.json > $D/bound_spread_c4.txt  # after the gap bound
python3 scripts/bench_lockstep.py --configs plain,lookup-priced-from2,lookup-priced-from2-uncached,plain-again --concurrency 1 --num-prompts 16 --max-tokens 96 --length-spread 0.5 --repeats 2 --json $D/reuse_c1.json > $D/reuse_c1.txt  # prompt lookup reusing prompts kept untapped
python3 scripts/bench_lockstep.py --configs plain,lookup3-governed-from2,lookup-priced-from2,default,plain-again --concurrency 4 --num-prompts 48 --max-tokens 96 --length-spread 0.5 --repeats 3 --json $D/reuse_spread_c4.json > $D/reuse_spread_c4.txt  # after the prompt-reuse fix
# prompt steps by the mode they ran in (the traces above), and an ungoverned priced lookup's prompt steps
for i in 3 4 5; do python3 $D/governor_trace.py lookup-priced-from2 4 48 /tmp/tr_pr_spread_$i.jsonl default 0.5; done
python3 $D/trace_report.py /tmp/tr_pr_spread_5.jsonl > $D/trace_priced_spread_c4_gap.txt
python3 $D/prompt_steps_by_mode.py /tmp/tr_pr_spread_*.jsonl /tmp/tr_l3_spread_*.jsonl > $D/prompt_steps_by_mode.txt
python3 $D/governor_trace.py lookup-priced 4 48 /tmp/tr_ungov.jsonl default 0.5 && python3 $D/prompt_steps_ungoverned.py /tmp/tr_ungov.jsonl > $D/prompt_steps_ungoverned.txt
python3 scripts/bench_lockstep.py --model $M --configs plain,lookup-priced-from2,lookup-priced-from2-uncached,plain-again --concurrency 1 --num-prompts 12 --max-tokens 96 --length-spread 0.5 --repeats 2 --json $D/qwen_reuse_c1.json > $D/qwen_reuse_c1.txt
python3 scripts/bench_lockstep.py --configs plain,default,plain-again --concurrency 32 --num-prompts 128 --max-tokens 96 --length-spread 0.5 --repeats 3 --json $D/spread_c32.json > $D/spread_c32.txt
python3 scripts/bench_lockstep.py --configs plain,default,lookup-priced-from2,plain-again --concurrency 1 --num-prompts 16 --max-tokens 96 --length-spread 0.5 --repeats 2 --json $D/spread_c1.json > $D/spread_c1.txt
