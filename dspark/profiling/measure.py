"""Measure the target's step time as a function of the tokens in one forward.

The prefix scheduler trades verification length against this curve. Each point is
the median of several timed forwards after warm-up, taken over interleaved sweeps of
the whole grid (a slow spell of the machine then slows one sweep of many points, not
every run of a few); a step of n tokens is laid out
as ceil(n / tokens_per_request) requests (a verification step's shape), each with
a KV context of `context_len` tokens.
"""

from __future__ import annotations

import hashlib
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from dspark.runtime.batch import FlatBatch
from dspark.runtime.cache import cache_root
# the machine's facts live in the runtime's leaf; read here for the profile's cache
# key and thread count (and patched here by tests of the profile)
from dspark.runtime.machine import busy_cores, machine_id, threads_for_load, usable_cpus  # noqa: F401
from dspark.runtime.target import Target


def default_token_counts(max_tokens: int = 512) -> list[int]:
    """Every count up to 40, where the scheduler's choices fall from one request to
    32 (a matmul's cost jumps at each multiple of its row tile: 6 rows in the AVX2
    kernel, 16 on AMX, where a 33-token step of 28 requests costs a fifth more than
    a 28-token one, and a table that interpolated 32 to 48 linearly priced such a
    verification at a fraction of that); both sides of the AMX tile edges at 48 and 64;
    then about 1.5x apart, where the cost grows linearly and the table interpolates,
    so that a profile takes seconds, not minutes."""
    grid = list(range(1, 41)) + [48, 49, 64, 65, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096]
    out = [n for n in grid if n <= max_tokens]
    if out[-1] != max_tokens:
        out.append(max_tokens)
    return out


def cache_key(target: Target, device: str, context_len: int, tokens_per_request: int) -> str:
    st = target.path / "model.safetensors"
    ident = f"{target.path.resolve()}:{st.stat().st_size if st.exists() else 0}"
    from dspark.runtime import cpu_kernels

    # the kernels' build: a faster runtime must not reuse the old runtime's step times
    kernels = cpu_kernels.build_id() if device == "cpu" and cpu_kernels.available() else "-"
    # the grid too: a table measured on an older, coarser grid is measured again
    grid = ",".join(map(str, default_token_counts(4096)))
    # and how it is measured: tables from before stalls were measured again over
    # interleaved passes are not reused
    method = "passes-spikes-remeasured"
    h = hashlib.sha1(f"{ident}|{machine_id()}|{context_len}|{tokens_per_request}|{kernels}|{grid}|{method}"
                     .encode()).hexdigest()[:10]
    dtype = getattr(target, "precision", None) or str(target.dtype).removeprefix("torch.")
    return f"{target.path.name}-{dtype}-{device}-{h}"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


#: a profile point whose first run takes longer than this is timed fewer times
LONG_STEP_MS = 100.0


@torch.inference_mode()
def measure_step_times(
    target: Target,
    token_counts: list[int],
    context_len: int = 256,
    tokens_per_request: int = 8,
    warmup: int = 2,
    repeats: int = 5,
    progress: Callable[[int, float], None] | None = None,
    spreads: list[float] | None = None,
    passes: int = 3,
) -> list[float]:
    """Median milliseconds of one target forward for each token count. With `spreads`,
    the relative spread (max - min) / median of each point's timed runs is appended
    to it (a repeatability measure: near 0 on a quiet machine).

    The timed runs of a point are spread over `passes` sweeps of the whole grid
    (`repeats` in all, at least one per pass; `warmup` untimed runs before a point's
    first pass, one before each later one). A machine that slows down for a few
    seconds then slows one pass of many points, not every run of a few neighbouring
    points, and the median of a point's runs leaves it out. A point whose first run
    takes over LONG_STEP_MS gets one warm-up and at most 2 timed runs, in the first
    pass: its relative noise is small, and it dominates the profile's duration."""
    max_req = max(-(-n // tokens_per_request) for n in token_counts)
    max_len = context_len + tokens_per_request + 1
    cache = target.new_cache(max_req, max_len)
    slots = [cache.allocate(i) for i in range(max_req)]
    dev = target.device
    g = torch.Generator().manual_seed(0)
    vocab = target.cfg.vocab_size
    # Fill every slot's context once (one prefill, copied: attention costs the same
    # whatever the keys hold); each timed step then rolls back to it.
    ctx = torch.randint(0, vocab, (context_len,), generator=g).tolist()
    target.model(FlatBatch.from_requests([ctx], [0], [slots[0]], logits="none", device=dev), cache)
    for s in slots[1:]:
        for t in (*cache.k, *cache.v):
            t[s, :, :context_len] = t[slots[0], :, :context_len]
        cache.lengths[s] = context_len
    batches = []
    for n in token_counts:
        r = -(-n // tokens_per_request)
        sizes = [tokens_per_request] * (r - 1) + [n - tokens_per_request * (r - 1)]
        toks = [torch.randint(0, vocab, (k,), generator=g).tolist() for k in sizes]
        batches.append((r, FlatBatch.from_requests(toks, [context_len] * r, slots[:r], logits="all", device=dev)))

    def forward(r: int, batch: FlatBatch) -> float:
        for s in slots[:r]:
            cache.truncate(s, context_len)
        _sync(dev)
        t0 = time.perf_counter()
        target.model(batch, cache)
        _sync(dev)
        return (time.perf_counter() - t0) * 1000

    passes = profile_passes(passes, repeats)
    per_pass = [repeats // passes + (1 if p < repeats % passes else 0) for p in range(passes)]
    times: list[list[float]] = [[] for _ in token_counts]
    long = [False] * len(token_counts)
    for p, runs in enumerate(per_pass):
        for i, (r, batch) in enumerate(batches):
            if not long[i]:
                if p == 0 and forward(r, batch) > LONG_STEP_MS:  # one warm-up, at most 2 timed runs, now
                    long[i] = True
                    times[i] = [forward(r, batch) for _ in range(min(repeats, 2))]
                else:
                    for _ in range(warmup - 1 if p == 0 else 1):
                        forward(r, batch)
                    times[i].extend(forward(r, batch) for _ in range(runs))
            if progress:  # once per point and pass
                progress(token_counts[i], statistics.median(times[i]))
    out = []
    for i in range(len(token_counts)):
        ms = statistics.median(times[i])
        out.append(ms)
        if spreads is not None:
            spreads.append((max(times[i]) - min(times[i])) / ms if ms > 0 else 0.0)
    return out


def profile_passes(passes: int = 3, repeats: int = 5) -> int:
    """The passes `measure_step_times` makes: `passes`, at most one per timed run."""
    return max(1, min(passes, repeats))


def profile_dir() -> Path:
    return cache_root() / "profiles"
