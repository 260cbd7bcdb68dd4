"""The default at one request, the 16 held-out prompts of bench_lockstep.py one after
another (lengths 48-144): each trial of the drafter governor's one-request level, with
the drafter's and lookup alone's efficiency and tokens over steps in that trial.

    python3 benchmarks/avx2-s53/first_trial.py
"""
import random, sys
from dspark.bench.dataset import heldout_prompts
from dspark.engine.config import DEFAULT_SPECULATIVE, SpeculativeConfig
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.engine import governor as G
from dspark.runtime.target import Target
from dspark.sampling import SamplingParams

target = Target.load("default", dtype="auto", device="cpu", max_len=2048)
prompts = [target.tokenizer.apply_chat_template(p.chat_messages()) for p in heldout_prompts("mixed", 16)]
rng = random.Random(0)
lengths = [max(1, round(96 * (1 + 0.5 * rng.uniform(-1, 1)))) for _ in prompts]
e = LLMEngine(target, SpeculativeConfig(**DEFAULT_SPECULATIVE), EngineConfig(max_num_seqs=1, max_model_len=2048))
e.generate(prompts[:1], SamplingParams(max_tokens=8, ignore_eos=True))
lv_end = G.LoadLevel._end_trial
step = [0]
def end(self):
    if self is e.drafter_governor.levels.get(0):
        s, p = self._efficiency(G.SPEC), self._efficiency(G.PLAIN)
        rs, rp = self._run[G.SPEC], self._run[G.PLAIN]
        print(f"step {step[0]}: trial drafter {s:.3f} ({rs[2]:.0f} tok/{rs[3]:.0f} steps) lookup {p:.3f} ({rp[2]:.0f}/{rp[3]:.0f})", end="")
    lv_end(self)
    if self is e.drafter_governor.levels.get(0):
        print(f" -> scores {self.score[G.SPEC]:.3f}/{self.score[G.PLAIN]:.3f}, mode {self.mode}, gap {self.gap}")
G.LoadLevel._end_trial = end
for p, n in zip(prompts, lengths):
    e.add_request(p, SamplingParams(max_tokens=n, ignore_eos=True))
while e.has_unfinished():
    e.step(); step[0] += 1
print("steps", step[0], e.drafter_governor.summary())
