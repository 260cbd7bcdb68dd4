"""The default (hybrid) with the lookup gate at one request (`default`) and without it (`default-nogate`; the same as the shipped default now, which gates from 2 requests), beside fixed 3-token lookup and plain
decoding: engines stepped in turn, 16 held-out prompts twice, one request, 96 tokens.

    python3 benchmarks/avx2-s49/default_gate_ab.py
"""
import time
from dspark.bench.dataset import heldout_prompts
from dspark.engine.config import DEFAULT_SPECULATIVE, SpeculativeConfig
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.engine.draft_gate import DraftGate
from dspark.runtime.target import Target
from dspark.sampling import SamplingParams
t = Target.load("default", dtype="auto", device="cpu", max_len=2048)
prompts = [t.tokenizer.apply_chat_template(p.chat_messages()) for p in heldout_prompts("mixed", 16)]
engines = {}
for name, spec in [("plain", None), ("lookup3", {"method": "ngram", "num_speculative_tokens": 3}),
                   ("default", DEFAULT_SPECULATIVE),
                   ("default-nogate", DEFAULT_SPECULATIVE)]:
    e = LLMEngine(t, spec and SpeculativeConfig(**spec), EngineConfig(max_num_seqs=1, max_model_len=2048))
    if name == "default-nogate":
        e.runner.lookup_gate = DraftGate(patience=10**9)
    if name == "default":  # the lookup gate at every load, as before LOOKUP_GATE_FROM
        e.runner.lookup_gate_from = 1
    engines[name] = e
secs = {k: 0.0 for k in engines}
params = SamplingParams(max_tokens=96, ignore_eos=True)
for rep in range(2):
    for p in prompts:
        for e in engines.values():
            e.add_request(p, params)
        while any(e.has_unfinished() for e in engines.values()):
            for k, e in engines.items():
                if e.has_unfinished():
                    t0 = time.perf_counter()
                    e.step()
                    secs[k] += time.perf_counter() - t0
for k, e in engines.items():
    print(k, "x plain %.3f" % (secs["plain"] / secs[k]), "tau %.3f" % e.total_stats().acceptance_length)
