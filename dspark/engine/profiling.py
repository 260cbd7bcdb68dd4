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


#: a profile whose points vary more than this between their timed runs (median of
#: (max - min) / median) was measured on a busy machine: used once, never cached
NOISY_SPREAD = 0.5
#: a cached table is re-measured when a spot check differs from it by this factor
SPOT_CHECK_FACTOR = 2.0
SPOT_CHECK_TOKENS = 8


def _say(msg: str, quiet: bool) -> None:
    if not quiet:
        print(msg, file=sys.stderr)


def spot_check(target, table, context_len: int, tokens_per_request: int) -> tuple[bool, str]:
    """Does a cached table still hold here and now? One point re-measured (a few
    forwards); (ok, what was compared)."""
    from dspark.runtime.profiler import measure_step_times

    n = min(SPOT_CHECK_TOKENS, table.max_token_count)
    now = measure_step_times(target, [n], context_len, tokens_per_request, warmup=1, repeats=3)[0]
    then = table.target_time(n) * 1000
    ratio = now / then if then > 0 else float("inf")
    ok = 1 / SPOT_CHECK_FACTOR <= ratio <= SPOT_CHECK_FACTOR
    return ok, f"{n} tokens: {now:.1f} ms now, {then:.1f} ms in the table"


def profile_target(target, max_tokens: int = 512, context_len: int = 256, tokens_per_request: int = 8,
                   repeats: int = 5, warmup: int = 2, out: Path | None = None, force: bool = False,
                   quiet: bool = False):
    """Load the cached table for this model/dtype/device/machine or measure it.

    A cached table is used only after a spot check agrees with it (else it is measured
    again); an unreadable one is measured again too. Before measuring, the CPU time
    other processes take is probed: with cores busy, torch gets fewer threads (the
    whole process keeps them), since OpenMP threads that wait for a busy core make
    every step many times slower. A table whose runs were not repeatable, or measured
    while other work ran, is used for this process only and not cached.
    Returns (table, path, reused_from_cache)."""
    from tqdm import tqdm

    from dspark.runtime.profiler import (busy_cores, cache_key, default_token_counts, machine_id,
                                         measure_step_times, profile_dir, threads_for_load, usable_cpus)
    from dspark.schedule.step_time import ScheduleError, StepTimeTable

    if max_tokens < 1 or context_len < 1 or tokens_per_request < 1 or repeats < 1 or warmup < 0:
        raise UserError("--max-tokens, --context-len, --tokens-per-request and --repeats must be positive")
    device = target.device.type
    busy = busy_cores() if device == "cpu" else None
    threads = torch.get_num_threads()
    fit = threads_for_load(threads, busy)
    if fit < threads:
        torch.set_num_threads(fit)
        _say(f"other processes keep {busy:.1f} of {usable_cpus()} CPU cores busy: using {fit} thread(s) "
             f"instead of {threads}", quiet)

    def cached_path() -> Path:
        return out or profile_dir() / f"{cache_key(target, device, context_len, tokens_per_request)}-{max_tokens}.json"

    path = cached_path()
    if path.is_file() and not force:
        try:
            table = StepTimeTable.load(path)
        except ScheduleError as e:
            _say(f"cannot use the cached step-time table ({e}); measuring again", quiet)
        else:
            ok, detail = spot_check(target, table, context_len, tokens_per_request)
            if ok:
                return table, path, True
            _say(f"the cached step-time table {path} no longer holds ({detail}); measuring again", quiet)
    counts = default_token_counts(max_tokens)
    bar = tqdm(total=len(counts), desc="profiling step time", unit="pt", disable=quiet, file=sys.stderr)

    def tick(n: int, ms: float) -> None:
        bar.set_postfix_str(f"{n} tok: {ms:.1f} ms")
        bar.update(1)

    spreads: list[float] = []
    t0 = time.monotonic()
    raw = measure_step_times(target, counts, context_len, tokens_per_request, warmup, repeats, tick, spreads)
    bar.close()
    seconds = time.monotonic() - t0
    busy_after = busy_cores(0.2) if device == "cpu" else None
    spread = statistics.median(spreads)
    others = max(busy or 0.0, busy_after or 0.0)
    noisy = spread > NOISY_SPREAD or others >= 0.5
    conditions = {"threads": torch.get_num_threads(), "threads_requested": threads, "cpus": usable_cpus(), "busy_cores_before": busy,
                  "busy_cores_after": busy_after, "median_spread": round(spread, 4), "cached": not noisy,
                  "seconds": round(seconds, 1)}
    table = StepTimeTable(token_counts=counts, raw_ms=raw, model=target.name,
                          dtype=getattr(target, "precision", None) or str(target.dtype).removeprefix("torch."),
                          device=device, machine=machine_id(), context_len=context_len, conditions=conditions)
    if noisy:
        _say(f"step times were not repeatable (median spread {spread:.0%}, other work on {others:.1f} cores): "
             "this table is used by this process only and not cached", quiet)
        if out is not None:
            table.save(out)
        return table, path, False
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


class StepWatch:
    """Serving-time check of the step-time table: each step's wall time against the
    table's prediction for its shape. When the median ratio over `window` steps
    exceeds `factor` (another process took a core, the typical cause), the CPU time of
    other processes is probed and torch falls back to the threads that fit beside it;
    once that load is gone again (probed every `recheck` steps), the threads return.
    `slow_windows` counts windows that ran slow, `fallbacks` thread reductions."""

    #: steps whose median ratio (measured / table) decides a refresh, and the bound:
    #: a ratio outside [1 / DRIFT_BOUND, DRIFT_BOUND] with no other load on the CPU
    #: rescales the table by it (the table, not the machine, is off)
    DRIFT_WINDOW = 128
    DRIFT_BOUND = 1.5

    def __init__(self, table, window: int = 16, factor: float = 3.0, recheck: int = 256, quiet: bool = False):
        self.table = table
        self.drift_ratios: list[float] = []
        self.refreshes = 0
        self.window = window
        self.factor = factor
        self.recheck = recheck
        self.quiet = quiet
        self.ratios: list[float] = []
        # the threads asked for (a profile on a busy machine may have started with fewer)
        self.threads = int((table.conditions or {}).get("threads_requested") or torch.get_num_threads())
        self.reduced = torch.get_num_threads() < self.threads
        self.steps_since_probe = 0
        self.slow_windows = 0
        self.fallbacks = 0

    def _check_drift(self) -> None:
        from dspark.runtime.profiler import busy_cores

        ratio = statistics.median(self.drift_ratios)
        self.drift_ratios.clear()
        if 1 / self.DRIFT_BOUND <= ratio <= self.DRIFT_BOUND or self.reduced:
            return
        busy = busy_cores(0.05)
        if busy is not None and busy >= 0.5:
            return  # another process, not the table: the thread fallback handles it
        self.table.scale(ratio)
        self.refreshes += 1
        _say(f"steps ran {ratio:.2f}x the step-time table's times over the last {self.DRIFT_WINDOW} steps with the "
             f"CPU otherwise idle: the table is rescaled to match (refresh {self.refreshes})", self.quiet)

    def record(self, n_tokens: int, n_requests: int, seconds: float) -> None:
        from dspark.runtime.profiler import busy_cores, threads_for_load

        if n_tokens <= 0:
            return
        predicted = self.table.step_time(n_tokens, n_requests)
        if predicted > 0:
            self.ratios.append(seconds / predicted)
            self.drift_ratios.append(seconds / predicted)
            if len(self.drift_ratios) >= self.DRIFT_WINDOW:
                self._check_drift()
        self.steps_since_probe += 1
        if self.reduced and self.steps_since_probe >= self.recheck:
            self.steps_since_probe = 0
            busy = busy_cores(0.05)
            if busy is not None and threads_for_load(self.threads, busy) == self.threads:
                torch.set_num_threads(self.threads)
                self.reduced = False
                _say(f"the other CPU load is gone: back to {self.threads} threads", self.quiet)
        if len(self.ratios) < self.window:
            return
        ratio = statistics.median(self.ratios)
        self.ratios.clear()
        if ratio <= self.factor:
            return
        self.slow_windows += 1
        busy = busy_cores(0.1)
        fit = threads_for_load(torch.get_num_threads(), busy)
        if fit < torch.get_num_threads():
            torch.set_num_threads(fit)
            self.reduced = True
            self.fallbacks += 1
            self.steps_since_probe = 0
            _say(f"steps ran {ratio:.1f}x slower than the step-time table with other processes on "
                 f"{busy:.1f} cores: using {fit} thread(s)", self.quiet)
        else:
            _say(f"steps ran {ratio:.1f}x slower than the step-time table (other processes on "
                 f"{0.0 if busy is None else busy:.1f} cores); the scheduler's costs are off", self.quiet)
