"""Plain decoding against the default, stepped in turn (as scripts/bench_lockstep.py), with
every step's wall time, target-forward time and forward tokens kept: where the default's
extra time goes, split into steps with prompt tokens and pure decode steps.

    python3 benchmarks/avx2-s46/step_kinds.py 32 64 [plain,default]   (configurations in stepping order)
"""
import sys, time, statistics
from dspark.bench.dataset import heldout_prompts
from dspark.engine.config import SpeculativeConfig, DEFAULT_SPECULATIVE
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.runtime.target import Target
from dspark.sampling import SamplingParams

C = int(sys.argv[1]) if len(sys.argv) > 1 else 32
N = int(sys.argv[2]) if len(sys.argv) > 2 else 64
target = Target.load("default", dtype="auto", device="cpu", max_len=2048)
prompts = [target.tokenizer.apply_chat_template(p.chat_messages()) for p in heldout_prompts("mixed", N)]
params = SamplingParams(max_tokens=96, ignore_eos=True)
lanes = {}
names = (sys.argv[3] if len(sys.argv) > 3 else "plain,default").split(",")
for i, kind in enumerate(names):
    name = f"{i}:{kind}"
    spec = SpeculativeConfig(**DEFAULT_SPECULATIVE) if kind == "default" else None
    e = LLMEngine(target, spec, EngineConfig(max_num_seqs=C, max_model_len=2048))
    e.generate(prompts[:2], SamplingParams(max_tokens=8, ignore_eos=True))
    lanes[name] = (e, list(prompts)[::-1], [])
while any(p or e.has_unfinished() for e, p, _ in lanes.values()):
    for name, (e, pending, out) in lanes.items():
        if not (pending or e.has_unfinished()):
            continue
        while pending and len(e.running) + len(e.waiting) < C:
            e.add_request(pending.pop(), params)
        t = time.perf_counter(); res = e.step(); dt = time.perf_counter() - t
        r = e.runner
        out.append((dt, r.last_target_seconds, r.last_forward_tokens, sum(len(o.new_tokens) for o in res)))
for name, (e, _, out) in lanes.items():
    pre = [x for x in out if x[2] > x[3] + 8]  # steps whose forward held prompt tokens
    dec = [x for x in out if not x[2] > x[3] + 8]
    tot = sum(x[0] for x in out)
    print(f"{name:8} steps {len(out)} total {tot:.2f} s | prompt steps {len(pre)}: {sum(x[0] for x in pre):.2f} s "
          f"(target {sum(x[1] for x in pre):.2f}) | decode steps {len(dec)}: {sum(x[0] for x in dec):.2f} s "
          f"(target {sum(x[1] for x in dec):.2f}, outside median {1e3 * statistics.median(x[0] - x[1] for x in dec):.3f} ms)")
