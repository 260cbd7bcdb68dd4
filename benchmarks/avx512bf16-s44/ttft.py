"""32 prompts arriving at once: time to each first token and to the end, plain vs default, alternated."""
import sys, time, statistics
from dspark.bench.dataset import heldout_prompts
from dspark.engine.config import SpeculativeConfig, DEFAULT_SPECULATIVE
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.runtime.target import Target
from dspark.sampling import SamplingParams
C = int(sys.argv[1]) if len(sys.argv) > 1 else 32
target = Target.load("default", dtype="auto", device="cpu", max_len=2048, log=lambda *a: None)
allp = [target.tokenizer.apply_chat_template(p.chat_messages()) for p in heldout_prompts("mixed", C * 7)]
engines = {}
for name, spec in (("plain", None), ("default", SpeculativeConfig(**DEFAULT_SPECULATIVE))):
    e = LLMEngine(target, spec)  # the server's EngineConfig defaults
    e.generate(allp[:4], SamplingParams(max_tokens=8, ignore_eos=True))
    engines[name] = e
if "history" in sys.argv:  # what a served sweep did before its c=16/32 points: c=1 and c=4 traffic
    extra = [target.tokenizer.apply_chat_template(p.chat_messages()) for p in heldout_prompts("mixed", C * 7 + 48)][C * 7:]
    for name, e in engines.items():
        t = time.perf_counter()
        for i in range(0, 12):
            e.generate([extra[i]], SamplingParams(max_tokens=64, ignore_eos=True))
        for i in range(12, 48, 4):
            e.generate(extra[i:i + 4], SamplingParams(max_tokens=64, ignore_eos=True))
        print(f"history {name}: {time.perf_counter() - t:.1f} s", flush=True)
print("max_num_seqs", engines["plain"].config.max_num_seqs, "prefill budget", engines["plain"].config.max_prefill_tokens)
res = {n: [] for n in engines}
for rnd in range(6):
    prompts = allp[C * rnd: C * (rnd + 1)]
    for name in (["plain", "default"] if rnd % 2 == 0 else ["default", "plain"]):
        e = engines[name]
        t0 = time.perf_counter()
        seqs = [e.add_request(p, SamplingParams(max_tokens=64, ignore_eos=True)) for p in prompts]
        first = {}
        steps = 0
        while e.has_unfinished():
            e.step(); steps += 1
            now = time.perf_counter() - t0
            for s in seqs:
                if s.output_ids and id(s) not in first:
                    first[id(s)] = now
        total = time.perf_counter() - t0
        ttft = statistics.median(first.values())
        spec_steps = e.governor.steps("speculative") if e.governor else 0
        res[name].append((ttft, total))
        print(f"round {rnd} {name:8} TTFT median {ttft*1e3:7.1f} ms  total {total:6.2f} s  steps {steps}  gov spec steps so far {spec_steps}", flush=True)
for n, v in res.items():
    print(n, "TTFT", [round(a*1e3) for a, _ in v], "total", [round(b, 2) for _, b in v])
