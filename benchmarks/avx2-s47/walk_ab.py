"""The DSpark draft call before (d0f1e7c: the Markov head's loop over positions) and
after (markov_walk.py: every row precomputed), on a draft captured in a running engine
(3 requests): 200 randomized comparisons (greedy and sampled, lookup proposals of
random length and confidence) count drafts whose tokens or lookup counts differ and
the largest logit difference (the bias is summed in another order), then both are
timed, called alternately.

    python3 benchmarks/avx2-s47/walk_ab.py
"""
import importlib.util, random, statistics, subprocess, sys, time
from pathlib import Path
import torch
from dspark.bench.dataset import heldout_prompts
from dspark.drafters.base import DraftRequest
from dspark.engine.config import SpeculativeConfig, DEFAULT_SPECULATIVE
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.runtime.target import Target
from dspark.sampling import SamplingParams

here = Path(__file__).resolve().parents[2]
old_src = subprocess.run(["git", "show", "d0f1e7c:dspark/drafters/dspark.py"], cwd=here, capture_output=True,
                         text=True, check=True).stdout
Path("/tmp/dspark_before.py").write_text(old_src.replace("from .", "from dspark.drafters."))
spec = importlib.util.spec_from_file_location("before", "/tmp/dspark_before.py")
old = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old)

target = Target.load("default", dtype="auto", device="cpu", max_len=2048)
prompts = [target.tokenizer.apply_chat_template(p.chat_messages()) for p in heldout_prompts("mixed", 8)]
e = LLMEngine(target, SpeculativeConfig(**DEFAULT_SPECULATIVE), EngineConfig(max_num_seqs=4, max_model_len=2048))
e.governor.speculating = lambda n: True
inner = e.runner.drafter.inner
captured, new_draft = [], inner.draft
inner.draft = lambda requests, n, lookup=None: (captured.append((list(requests), n)), new_draft(requests, n, lookup=lookup))[1]
for p in prompts[:4]:
    e.add_request(p, SamplingParams(max_tokens=300, ignore_eos=True))
while len(captured) < 3 and e.has_unfinished():
    e.step()
inner.draft = new_draft
reqs, n = captured[-1]
old_draft = lambda rs, n, lookup=None: getattr(old, type(inner).__name__).draft(inner, rs, n, lookup=lookup)
rng, bad, worst = random.Random(0), 0, 0.0
for trial in range(200):
    sampled = trial % 2 == 1
    rs = [DraftRequest(r.request_id, r.anchor_token, r.anchor_position,
                       SamplingParams(temperature=0.8, top_p=0.9) if sampled else r.params,
                       torch.Generator().manual_seed(trial) if sampled else None) for r in reqs]
    lk = None
    if trial % 3:
        lk = []
        for _ in rs:
            m = rng.randint(0, n)
            lk.append(([rng.randrange(49152) for _ in range(m)], sorted((rng.random() for _ in range(m)), reverse=True)))
    outs = []
    for f in (old_draft, new_draft):
        for r in rs:
            if r.generator is not None:
                r.generator.manual_seed(trial)
        outs.append(f(rs, n, lookup=lk))
    a, b = outs
    fin = torch.isfinite(a.logits)
    assert torch.equal(fin, torch.isfinite(b.logits))
    worst = max(worst, (a.logits[fin] - b.logits[fin]).abs().max().item())
    same = torch.equal(a.tokens, b.tokens)
    same &= (a.num_lookup is None) == (b.num_lookup is None) and (a.num_lookup is None or torch.equal(a.num_lookup, b.num_lookup))
    same &= (a.confidence - b.confidence).abs().max().item() <= 1e-5
    bad += not same
print(f"{len(reqs)} requests, {n} tokens: {bad} of 200 randomized drafts differ in tokens, lookup counts or "
      f"confidences; largest logit difference {worst:.2e}")
def timed_pair(f, g, k=60):
    """Medians of f and g in ms, called alternately (drift falls on both alike)."""
    for _ in range(5):
        f(), g()
    tf, tg = [], []
    for _ in range(k):
        for fn, ts in ((f, tf), (g, tg)):
            t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    return statistics.median(tf) * 1e3, statistics.median(tg) * 1e3
for rr in (reqs[:1], reqs):
    lk = [([], [])] * len(rr)
    a = timed_pair(lambda: old_draft(rr, n, lookup=lk), lambda: new_draft(rr, n, lookup=lk))
    b = timed_pair(lambda: old_draft(rr, n), lambda: new_draft(rr, n))
    print(f"{len(rr)} request(s): with lookup {a[0]:.2f} -> {a[1]:.2f} ms; without {b[0]:.2f} -> {b[1]:.2f} ms")
