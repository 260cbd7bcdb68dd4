"""The default configuration with verification priced on the whole step (new) against
priced on the speculating requests alone (old: a step's other decodes and prompt tokens
left out of the step-time lookup), and plain decoding: engines stepped in turn.

    python3 benchmarks/avx512bf16-s45/ab_pricing.py CONCURRENCY NUM_PROMPTS REPEATS [held-spec]

`held-spec`: both speculating engines' governors held in speculation."""
import os, sys, statistics
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
from bench_lockstep import Lane
import dspark.engine.runner as runner_mod
from dspark.bench.dataset import heldout_prompts
from dspark.engine.config import SpeculativeConfig, DEFAULT_SPECULATIVE
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.runtime.target import Target
from dspark.sampling import SamplingParams

C, N, R = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
held = "held-spec" in sys.argv
OLD = {"on": False}
_free = runner_mod.free_lengths
runner_mod.free_lengths = lambda s, t, o=0, p=0: _free(s, t) if OLD["on"] else _free(s, t, o, p)
target = Target.load("default", dtype="auto", device="cpu", max_len=2048)
prompts = [target.tokenizer.apply_chat_template(p.chat_messages()) for p in heldout_prompts("mixed", N)]
params = SamplingParams(max_tokens=96, ignore_eos=True)
names = ["plain", "new", "old"]
res = {n: [] for n in names}
for rep in range(R):
    order = names[rep % 3:] + names[:rep % 3]
    lanes = []
    for name in order:
        spec = None if name == "plain" else SpeculativeConfig(**DEFAULT_SPECULATIVE)
        e = LLMEngine(target, spec, EngineConfig(max_num_seqs=C, max_model_len=2048))
        if name == "old":
            pol = e.runner.policy
            choose = pol.choose
            pol.choose = lambda s, o=0, p=0, _c=choose: _c(s)
        e.generate(prompts[:C], SamplingParams(max_tokens=8, ignore_eos=True))
        if spec is not None and held:
            e.governor.speculating = lambda n: True
        lane = Lane(name, e, prompts, params, C)
        step = lane.step
        def stepped(_step=step, _old=(name == "old")):
            OLD["on"] = _old
            _step()
        lane.step = stepped
        lanes.append(lane)
    while not all(l.done() for l in lanes):
        for l in lanes:
            if not l.done():
                l.step()
    t = {l.name: l.seconds for l in lanes}
    for l in lanes:
        res[l.name].append(t["plain"] / l.seconds)
    print(f"repeat {rep + 1}: " + "  ".join(f"{l.name} x{t['plain'] / l.seconds:.3f} ({l.speculated}/{l.steps} spec)"
                                            for l in lanes), flush=True)
for n in names:
    print(f"{n:6} x plain {statistics.median(res[n]):.3f} [{min(res[n]):.3f}-{max(res[n]):.3f}]")
