"""Where a step's time outside the target goes, for engines that draft nothing: plain
decoding, the DSpark drafter alone with its drafter governor held off (`dspark-off`),
and the default held in plain mode (`default-held-plain`). One request, greedy, the
same prompts; cProfile over the decode steps, functions ranked by their own time with
the target's forward left out.

    python3 benchmarks/avx2-s53/outside_profile.py [configs] [steps]
"""

import cProfile
import pstats
import sys

from dspark.bench.dataset import heldout_prompts
from dspark.engine.config import DEFAULT_SPECULATIVE, SpeculativeConfig
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.runtime.target import Target
from dspark.sampling import SamplingParams

CONFIGS = {"plain": None, "dspark-off": dict(DEFAULT_SPECULATIVE, lookup=False),
           "default-held-plain": DEFAULT_SPECULATIVE, "default-lookup-alone": DEFAULT_SPECULATIVE}
names = sys.argv[1].split(",") if len(sys.argv) > 1 else list(CONFIGS)
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 600
OURS = len(sys.argv) > 3  # rank the engine's own functions (not the runtime's) by cumulative time
target = Target.load("default", dtype="auto", device="cpu", max_len=2048)
prompts = [target.tokenizer.apply_chat_template(p.chat_messages()) for p in heldout_prompts("mixed", 8)]
for name in names:
    spec = SpeculativeConfig(**CONFIGS[name]) if CONFIGS[name] else None
    e = LLMEngine(target, spec, EngineConfig(max_num_seqs=1, max_model_len=2048))
    e.generate(prompts[:1], SamplingParams(max_tokens=8, ignore_eos=True))
    if name == "default-held-plain":
        e.governor.speculating = lambda n: False
    if name in ("dspark-off", "default-lookup-alone"):
        e.drafter_governor.speculating = lambda n: False
    pending = [(p, SamplingParams(max_tokens=150, ignore_eos=True)) for p in prompts]
    prof = cProfile.Profile()
    n = 0
    while n < steps:
        if not e.has_unfinished():
            e.add_request(*pending.pop())
        prof.enable()
        e.step()
        prof.disable()
        n += 1
    st = pstats.Stats(prof)
    total = st.total_tt
    fwd = sum(v[3] for k, v in st.stats.items() if k[2] in ("forward",) and "model.py" in k[0])
    print(f"\n== {name}: {1e3 * total / steps:.3f} ms a step under the profiler, "
          f"target forward {1e3 * fwd / steps:.3f} ms (cumulative)")
    rows = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:22] if not OURS else sorted(
        [kv for kv in st.stats.items() if "dspark/" in kv[0][0] and "runtime" not in kv[0][0]], key=lambda kv: -kv[1][3])[:30]
    for (fn, line, func), (cc, nc, tt, ct, _) in rows:
        print(f"  {1e6 * tt / steps:8.1f} us own {1e6 * ct / steps:8.1f} us cum {nc / steps:6.2f}/step  "
              f"{fn.split('dspark/')[-1]}:{line} {func}")
