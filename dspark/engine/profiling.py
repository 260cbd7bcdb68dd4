"""Step-time tables for the prefix scheduler: the target's cost by token count
(measured by `dspark.runtime.profiler`, cached per model/dtype/device/machine) and
the drafter's cost by request count (measured here, per engine start)."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

from dspark.errors import UserError


def profile_target(target, max_tokens: int = 512, context_len: int = 256, tokens_per_request: int = 8,
                   repeats: int = 5, warmup: int = 2, out: Path | None = None, force: bool = False,
                   quiet: bool = False):
    """Load the cached table for this model/dtype/device/machine or measure it."""
    from tqdm import tqdm

    from dspark.runtime.profiler import cache_key, default_token_counts, machine_id, measure_step_times, profile_dir
    from dspark.schedule.step_time import StepTimeTable

    if max_tokens < 1 or context_len < 1 or tokens_per_request < 1 or repeats < 1 or warmup < 0:
        raise UserError("--max-tokens, --context-len, --tokens-per-request and --repeats must be positive")
    device = target.device.type
    path = out or profile_dir() / f"{cache_key(target, device, context_len, tokens_per_request)}-{max_tokens}.json"
    if path.is_file() and not force:
        return StepTimeTable.load(path), path, True
    counts = default_token_counts(max_tokens)
    bar = tqdm(total=len(counts), desc="profiling step time", unit="pt", disable=quiet, file=sys.stderr)

    def tick(n: int, ms: float) -> None:
        bar.set_postfix_str(f"{n} tok: {ms:.1f} ms")
        bar.update(1)

    raw = measure_step_times(target, counts, context_len, tokens_per_request, warmup, repeats, tick)
    bar.close()
    table = StepTimeTable(token_counts=counts, raw_ms=raw, model=target.name, dtype=getattr(target, "precision", None) or str(target.dtype).removeprefix("torch."),
                          device=device, machine=machine_id(), context_len=context_len)
    table.save(path)
    plot_table(table, path.with_suffix(".png"))
    return table, path, False


def plot_table(table, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(table.token_counts, table.raw_ms, "o", ms=3, alpha=0.6, label="measured median")
    ax.plot(table.token_counts, table.step_ms, "-", label="monotone (used by the scheduler)")
    ax.set_xlabel("tokens in one forward")
    ax.set_ylabel("step time (ms)")
    ax.set_title(f"{table.model} {table.dtype} on {table.device}, context {table.context_len}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)



@torch.inference_mode()
def measure_drafter_times(drafter, request_counts: list[int], num_tokens: int, context_len: int = 256,
                          warmup: int = 1, repeats: int = 3) -> list[float]:
    """Median milliseconds of one `draft` call of `num_tokens` for each request count."""
    from dspark.drafters.base import DraftRequest
    from dspark.sampling import SamplingParams

    if not drafter.target_layer_ids and drafter.method == "ngram":
        return [0.01 for _ in request_counts]
    cfg = drafter.target.cfg
    dev = next((p.device for p in drafter.parameters()), torch.device("cpu"))
    dtype = next((p.dtype for p in drafter.parameters()), torch.float32)
    g = torch.Generator().manual_seed(0)
    out = []
    params = SamplingParams()
    for r in request_counts:
        ids = [("profile", i) for i in range(r)]
        for rid in ids:
            drafter.add_request(rid)
        toks = [torch.randint(0, cfg.vocab_size, (context_len,), generator=g).tolist() for _ in ids]
        hidden = torch.randn(r * context_len, len(drafter.target_layer_ids), cfg.hidden_size, generator=g).to(dev, dtype)
        drafter.append_context(ids, toks, [0] * r, hidden)
        reqs = [DraftRequest(rid, 7, context_len, params, None) for rid in ids]
        times = []
        for i in range(warmup + repeats):
            t0 = time.perf_counter()
            drafter.draft(reqs, num_tokens)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            if i >= warmup:
                times.append((time.perf_counter() - t0) * 1000)
        for rid in ids:
            drafter.release(rid)
        out.append(statistics.median(times))
    return out


def load_or_profile(target, drafter, max_num_seqs: int, num_tokens: int, quiet: bool = False):
    """The scheduler's table: the cached target curve (measured on first use) plus
    this drafter's cost by request count."""
    from dspark.schedule.step_time import DrafterTimeTable

    max_tokens = max(64, max_num_seqs * (1 + num_tokens))
    table, _, _ = profile_target(target, max_tokens=max_tokens, quiet=quiet)
    if drafter is not None and num_tokens > 0:
        counts = sorted({1, 2, 4, 8, 16, 32, 64, max_num_seqs} & set(range(1, max_num_seqs + 1)))
        ms = measure_drafter_times(drafter, counts, num_tokens)
        table.drafter = DrafterTimeTable(drafter.method, counts, ms)
    return table
