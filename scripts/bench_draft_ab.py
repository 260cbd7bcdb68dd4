"""The DSpark draft call of an earlier revision against the working tree's, on the same
drafter state: first whether they draft the same, then which is faster.

A running engine (default configuration, held in speculation) is stepped until it has
drafted for --requests requests; that draft call is then replayed. The earlier
revision's `dspark/drafters/dspark.py` is loaded beside the current one and called
as the same drafter's method, so both read the same weights and KV cache.

Sameness (q built for greedy drafts too): --trials randomized drafts (greedy and sampled alternately, the sampled ones
with the same seeds; two in three with lookup proposals of random length and
confidence) count the drafts whose tokens, lookup counts or confidences (to 1e-5)
differ, and report the largest difference of their finite logits (the set of finite
logits must be the same). Speed: each call's median time, the two called alternately
so that the machine's drift falls on both alike, at one request and at all of them,
with empty lookup proposals (the common case at one request) and without lookup, each
as the engine calls it (`greedy_logits` as the engine sets it).

    python3 scripts/bench_draft_ab.py --before d0f1e7c
    python3 scripts/bench_draft_ab.py --before e7373d0 --trials 200 --requests 3
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def load_before(rev: str):
    """The module dspark/drafters/dspark.py as of `rev`, importable beside the current one."""
    try:
        src = subprocess.run(["git", "show", f"{rev}:dspark/drafters/dspark.py"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout
    except subprocess.CalledProcessError as e:
        sys.exit(f"cannot read dspark/drafters/dspark.py at {rev!r}: {e.stderr.strip()}")
    path = Path(tempfile.mkdtemp()) / "dspark_before.py"
    path.write_text(src.replace("from .", "from dspark.drafters."))
    spec = importlib.util.spec_from_file_location("dspark_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def capture(num_requests: int):
    """An engine's drafter and a draft call of `num_requests` requests taken from it."""
    from dspark.bench.dataset import heldout_prompts
    from dspark.engine.config import DEFAULT_SPECULATIVE, SpeculativeConfig
    from dspark.engine.engine import EngineConfig, LLMEngine
    from dspark.runtime.target import Target
    from dspark.sampling import SamplingParams

    target = Target.load("default", dtype="auto", device="cpu", max_len=2048)
    prompts = [target.tokenizer.apply_chat_template(p.chat_messages())
               for p in heldout_prompts("mixed", 2 * num_requests)]
    engine = LLMEngine(target, SpeculativeConfig(**DEFAULT_SPECULATIVE),
                       EngineConfig(max_num_seqs=num_requests, max_model_len=2048))
    engine.governor.speculating = lambda n: True
    if engine.drafter_governor is not None:  # the drafter on wherever it may run
        engine.drafter_governor.speculating = lambda n: True
    inner = engine.runner.drafter.inner
    captured, draft = [], inner.draft

    def spy(requests, n, lookup=None):
        captured.append((list(requests), n))
        return draft(requests, n, lookup=lookup)

    inner.draft = spy
    for p in prompts[:num_requests]:
        engine.add_request(p, SamplingParams(max_tokens=300, ignore_eos=True))
    while engine.has_unfinished() and not (captured and len(captured[-1][0]) == num_requests):
        engine.step()
    inner.draft = draft
    if not captured:
        sys.exit("the engine never drafted")
    return inner, captured[-1]


def compare(inner, old_draft, new_draft, reqs, n: int, trials: int) -> tuple[int, float]:
    from dspark.drafters.base import DraftRequest
    from dspark.sampling import SamplingParams

    rng, differ, worst = random.Random(0), 0, 0.0
    for trial in range(trials):
        sampled = trial % 2 == 1
        rs = [DraftRequest(r.request_id, r.anchor_token, r.anchor_position,
                           SamplingParams(temperature=0.8, top_p=0.9) if sampled else r.params,
                           torch.Generator().manual_seed(trial) if sampled else None) for r in reqs]
        lookup = None
        if trial % 3:
            lookup = []
            for _ in rs:
                m = rng.randint(0, n)
                lookup.append(([rng.randrange(inner.config.vocab_size) for _ in range(m)],
                               sorted((rng.random() for _ in range(m)), reverse=True)))
        outs = []
        for f in (old_draft, new_draft):
            for r in rs:
                if r.generator is not None:
                    r.generator.manual_seed(trial)
            outs.append(f(rs, n, lookup=lookup))
        a, b = outs
        finite = torch.isfinite(a.logits)
        if not torch.equal(finite, torch.isfinite(b.logits)):
            differ += 1
            continue
        worst = max(worst, (a.logits[finite] - b.logits[finite]).abs().max().item())
        same = torch.equal(a.tokens, b.tokens)
        same &= (a.num_lookup is None) == (b.num_lookup is None)
        same &= a.num_lookup is None or torch.equal(a.num_lookup, b.num_lookup)
        same &= (a.confidence - b.confidence).abs().max().item() <= 1e-5
        differ += not same
    return differ, worst


def timed_pair(f, g, k: int = 60) -> tuple[float, float]:
    """Medians of f and g in ms, called alternately."""
    for _ in range(5):
        f(), g()
    tf, tg = [], []
    for _ in range(k):
        for fn, ts in ((f, tf), (g, tg)):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
    return statistics.median(tf) * 1e3, statistics.median(tg) * 1e3


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="the earlier revision (a git commit or tag)")
    ap.add_argument("--requests", type=int, default=3, help="requests in the captured draft call (default 3)")
    ap.add_argument("--trials", type=int, default=200, help="randomized drafts compared (default 200)")
    args = ap.parse_args(argv)
    if args.requests < 1 or args.trials < 0:
        ap.error("--requests must be >= 1 and --trials >= 0")
    before = load_before(args.before)
    inner, (reqs, n) = capture(args.requests)
    old_cls = getattr(before, type(inner).__name__)
    new_draft = inner.draft

    def old_draft(rs, k, lookup=None):
        return old_cls.draft(inner, rs, k, lookup=lookup)

    engine_setting, inner.greedy_logits = inner.greedy_logits, True  # both give q, to compare it
    differ, worst = compare(inner, old_draft, new_draft, reqs, n, args.trials)
    inner.greedy_logits = engine_setting  # timed as the engine drafts
    print(f"{len(reqs)} requests, {n} tokens: {differ} of {args.trials} randomized drafts differ in tokens, "
          f"lookup counts or confidences; largest logit difference {worst:.2e}")
    for rr in (reqs[:1], reqs) if len(reqs) > 1 else (reqs,):
        empty = [([], [])] * len(rr)
        a = timed_pair(lambda: old_draft(rr, n, lookup=empty), lambda: new_draft(rr, n, lookup=empty))
        b = timed_pair(lambda: old_draft(rr, n), lambda: new_draft(rr, n))
        print(f"{len(rr)} request(s): with lookup {a[0]:.2f} -> {a[1]:.2f} ms; "
              f"without {b[0]:.2f} -> {b[1]:.2f} ms   ({args.before} -> working tree)")


if __name__ == "__main__":
    main()
