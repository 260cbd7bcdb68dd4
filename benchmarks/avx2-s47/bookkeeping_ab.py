"""Two pieces of a drafting step's bookkeeping, before (d0f1e7c) and after, on the shapes
of a draft at one and at four requests (7 tokens, the default model's 49,152-token
vocabulary, logits -inf outside 64 candidates as the DSpark draft returns them): the
fault check `faulty_rows` (greedy rows) and the hybrid drafter's running mean of its own
confidences. Same results asserted; medians of the two called alternately.

    python3 benchmarks/avx2-s47/bookkeeping_ab.py
"""
import importlib.util, statistics, subprocess, sys, time
from pathlib import Path
import torch
from dspark.drafters.base import DraftOutput
from dspark.engine.drafts import faulty_rows
from dspark.drafters.hybrid import HybridDrafter

root = Path(__file__).resolve().parents[2]


def before(path, name):
    """The module at `path` as of d0f1e7c, importable beside the current one."""
    src = subprocess.run(["git", "show", f"d0f1e7c:{path}"], cwd=root, capture_output=True, text=True,
                         check=True).stdout.replace("from .", "from dspark.drafters.")
    Path(f"/tmp/{name}.py").write_text(src)
    spec = importlib.util.spec_from_file_location(name, f"/tmp/{name}.py")
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


old = before("dspark/engine/drafts.py", "drafts_before")
hold = before("dspark/drafters/hybrid.py", "hybrid_before")


def pair(f, g, k=300):
    for _ in range(20):
        f(), g()
    a, b = [], []
    for _ in range(k):
        for fn, ts in ((f, a), (g, b)):
            t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    return statistics.median(a) * 1e6, statistics.median(b) * 1e6


class Stub:  # the attributes _update_drafter_mean reads
    max_draft_tokens = 7
    def __init__(self):
        self.drafter_mean = None


torch.manual_seed(0)
for r in (1, 4):
    logits = torch.full((r, 7, 49152), float("-inf"))
    cand = torch.randint(0, 49152, (r, 7, 64))
    logits.scatter_(2, cand, torch.randn(r, 7, 64))
    tokens = cand[:, :, 0]
    out = DraftOutput(tokens, logits, torch.rand(r, 7), num_lookup=torch.randint(0, 4, (r,)))
    greedy = [True] * r
    assert faulty_rows(out, greedy) == old.faulty_rows(out, greedy)
    bad = DraftOutput(tokens, logits.clone(), torch.rand(r, 7))
    bad.logits[r - 1, 3, tokens[r - 1, 3]] = float("nan")
    bad.confidence[0, 2] = 1.5
    assert faulty_rows(bad, greedy) == old.faulty_rows(bad, greedy) == ({0, r - 1})
    a = pair(lambda: old.faulty_rows(out, greedy), lambda: faulty_rows(out, greedy))
    s_old, s_new = Stub(), Stub()
    for _ in range(3):
        hold.HybridDrafter._update_drafter_mean(s_old, out, 7)
        HybridDrafter._update_drafter_mean(s_new, out, 7)
    assert s_old.drafter_mean == s_new.drafter_mean
    b = pair(lambda: hold.HybridDrafter._update_drafter_mean(s_old, out, 7),
             lambda: HybridDrafter._update_drafter_mean(s_new, out, 7))
    print(f"{r} request(s): faulty_rows {a[0]:.0f} -> {a[1]:.0f} us; drafter mean {b[0]:.0f} -> {b[1]:.0f} us")
