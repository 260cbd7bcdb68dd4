"""Step-time tables for the prefix scheduler: the target's cost by token count
(measured by `dspark.profiling.measure`, cached per model/dtype/device/machine) and
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
    from dspark.profiling.measure import measure_step_times

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

    from dspark.profiling.measure import (busy_cores, cache_key, default_token_counts, machine_id,
                                         measure_step_times, profile_dir, profile_passes, threads_for_load,
                                         usable_cpus)
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
    bar = tqdm(total=len(counts) * profile_passes(repeats=repeats), desc="profiling step time", unit="pt",
               disable=quiet, file=sys.stderr)

    def tick(n: int, ms: float) -> None:
        bar.set_postfix_str(f"{n} tok: {ms:.1f} ms")
        bar.update(1)

    spreads: list[float] = []
    t0 = time.monotonic()
    raw = measure_step_times(target, counts, context_len, tokens_per_request, warmup, repeats, tick, spreads)
    bar.close()
    remeasured = remeasure_spikes(target, counts, raw, context_len, tokens_per_request, warmup, repeats)
    seconds = time.monotonic() - t0
    busy_after = busy_cores(0.2) if device == "cpu" else None
    spread = statistics.median(spreads)
    others = max(busy or 0.0, busy_after or 0.0)
    noisy = spread > NOISY_SPREAD or others >= 0.5
    conditions = {"threads": torch.get_num_threads(), "threads_requested": threads, "cpus": usable_cpus(), "busy_cores_before": busy,
                  "busy_cores_after": busy_after, "median_spread": round(spread, 4), "cached": not noisy,
                  "remeasured": remeasured,
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
    return table, path, False


def remeasure_spikes(target, counts: list[int], raw: list[float], context_len: int, tokens_per_request: int,
                     warmup: int, repeats: int, passes: int = 2) -> list[int]:
    """Measure again the points that sit above their larger neighbours (`spikes`: a
    stall, which the running maximum would carry up to every larger count) and keep
    the lower median of the two (a wait only ever adds time). Changes `raw` in place;
    returns the counts measured again."""
    from dspark.profiling.measure import measure_step_times
    from dspark.schedule.step_time import spikes

    again: list[int] = []
    for _ in range(passes):
        idx = spikes(raw)
        if not idx:
            break
        new = measure_step_times(target, [counts[i] for i in idx], context_len, tokens_per_request, warmup, repeats)
        for i, ms in zip(idx, new):
            raw[i] = min(raw[i], ms)
        again.extend(counts[i] for i in idx)
    return again


@torch.inference_mode()
def measure_drafter_times(drafter, request_counts: list[int], num_tokens: int, context_len: int = 256,
                          warmup: int = 1, repeats: int = 3) -> list[float]:
    """Median milliseconds of one `draft` call of `num_tokens` for each request count."""
    from dspark.drafters.base import DraftRequest
    from dspark.sampling import SamplingParams

    if drafter.weightless:
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
