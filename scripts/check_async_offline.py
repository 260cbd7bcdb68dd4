"""dspark-async at 4 concurrent requests, offline: the cost tables, how often it drafts,
predicted against actual accepted tokens, then plain and dspark-async alternated.
Usage: python scripts/check_async_offline.py"""
import time, torch, numpy as np
from dspark.runtime.target import Target
from dspark.engine.engine import LLMEngine, EngineConfig
from dspark.sampling import SamplingParams
from dspark.speculative import SpeculativeConfig
from dspark.bench.dataset import heldout_prompts
t = Target.load("default", dtype="bf16")
spec = SpeculativeConfig.from_dict({"method": "dspark", "num_speculative_tokens": 7, "verification_policy": "dspark-async"})
eng = LLMEngine(t, spec, EngineConfig(max_num_seqs=32, max_model_len=2048))
pol = eng.runner.policy; tab = pol.table
print("target ms R=1,4,8,16,32:", [round(1000*tab.target_time(n),1) for n in (1,4,8,16,32)])
print("drafter ms R=1,4,8,16,32:", [round(1000*tab.drafter_time(n),1) for n in (1,4,8,16,32)])
print("step ms for 4 req + B=0,4,8,12,28:", [round(float(x),1) for x in tab.step_times(np.array([4,8,12,16,32]), 4)])
log = []
orig_choose = pol.choose
def choose(s):
    L = orig_choose(s)
    sv = np.asarray(s)
    log.append((sv.shape[0], sum(L), float(sum(sv[i, :L[i]].sum() for i in range(len(L))))))
    return L
pol.choose = choose
pool = heldout_prompts("mixed", 16)
prompts = [t.tokenizer.chat_prompt(p.messages[-1]["content"] if p.messages else p.prompt) for p in pool[:16]]
# 4 concurrent
before = eng.total_stats()
t0 = time.perf_counter(); seqs = []
steps = 0; timings = []
pending = list(prompts)
with torch.inference_mode():
    while pending or eng.has_unfinished():
        while pending and len(eng.running) + len(eng.waiting) < 4:
            seqs.append(eng.add_request(pending.pop(0), SamplingParams(max_tokens=64)))
        s0 = time.perf_counter(); eng.step(); timings.append(time.perf_counter() - s0); steps += 1
after = eng.total_stats()
n = sum(len(s.output_ids) for s in seqs)
print(f"{n} tokens in {time.perf_counter()-t0:.1f}s = {n/(time.perf_counter()-t0):.1f} tok/s, steps {steps}, skipped {pol.skipped_steps}")
drafted = len(log); B = sum(x[1] for x in log); pred = sum(x[2] for x in log)
print(f"drafted steps {drafted}, admitted {B}, predicted accepted {pred:.1f}, actual accepted {after.accepted_tokens - before.accepted_tokens}, draft tokens {after.draft_tokens-before.draft_tokens}")
print("median step ms", 1000*np.median(timings))
for label, sp in (("plain", None), ("adaptive", spec), ("plain", None), ("adaptive", spec)):
    e = LLMEngine(t, sp, EngineConfig(max_num_seqs=32, max_model_len=2048))
    pend = list(prompts); ss = []; t0 = time.perf_counter()
    with torch.inference_mode():
        while pend or e.has_unfinished():
            while pend and len(e.running) + len(e.waiting) < 4:
                ss.append(e.add_request(pend.pop(0), SamplingParams(max_tokens=64)))
            e.step()
    n = sum(len(s.output_ids) for s in ss); dt = time.perf_counter() - t0
    print(label, f"{n/dt:.1f} tok/s", "skipped", getattr(getattr(e.runner, "policy", None), "skipped_steps", "-"))
