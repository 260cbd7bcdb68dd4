"""The target forward at one request in the running default engine, by forward tokens,
speculated or not, drafted or not (median and 10th percentile of runner.last_target_seconds).

    python3 benchmarks/avx2-s46/forward_by_tokens.py
"""
import sys, collections, statistics
from dspark.bench.dataset import heldout_prompts
from dspark.engine.config import SpeculativeConfig, DEFAULT_SPECULATIVE
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.runtime.target import Target
from dspark.sampling import SamplingParams
target = Target.load("default", dtype="auto", device="cpu", max_len=2048)
prompts = [target.tokenizer.apply_chat_template(p.chat_messages()) for p in heldout_prompts("mixed", 12)]
e = LLMEngine(target, SpeculativeConfig(**DEFAULT_SPECULATIVE), EngineConfig(max_num_seqs=1, max_model_len=2048))
params = SamplingParams(max_tokens=96, ignore_eos=True)
d = collections.defaultdict(list)
for p in prompts:
    e.add_request(p, params)
    while e.has_unfinished():
        e.step(); r = e.runner
        if r.last_forward_tokens <= 9:
            d[(r.last_forward_tokens, r.last_speculated, r.last_drafted_requests > 0)].append(r.last_target_seconds * 1e3)
for k in sorted(d):
    v = d[k]
    print("tokens %d speculated %d drafted %d: n=%4d median %.2f ms  p10 %.2f" % (*k, len(v), statistics.median(v), sorted(v)[len(v)//10]))
