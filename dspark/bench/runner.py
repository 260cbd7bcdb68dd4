"""`run_benchmark`: send prompts to a server, closed or open loop, and report.

Load shapes:
- closed loop: `max_concurrency=N` keeps at most N requests in flight; each new one
  is sent when one finishes (with `request_rate=inf`, the default);
- open loop: `request_rate=R` sends requests at random times, a Poisson process of
  R per second (gamma-distributed gaps with shape `burstiness`, 1 = Poisson) drawn
  from `seed`; `max_concurrency` may still cap what is in flight;
- `request_rate=inf` without a cap sends everything at once.

Warm-up requests run first at the same concurrency and are not measured. The
server's `/metrics` is read after the warm-ups and after the run; the difference of
the speculative-decoding counters gives acceptance (see `prometheus.py`), so other
traffic on the same server during the run would be counted too.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

import httpx

from .client import ENDPOINTS, RequestResult, request_body, stream_request
from .dataset import DATASETS, BenchPrompt, DatasetError, load_bench_prompts
from .prometheus import SpecDecodeCounters, acceptance_between, read_spec_counters
from .stats import GOODPUT_KEYS, RequestTiming, latency_figures


class BenchError(ValueError):
    """The benchmark cannot run as asked (bad option, unreachable server); the
    message says what to do."""


@dataclass
class LoadConfig:
    base_url: str
    endpoint: str = "chat"
    #: the model name sent in requests; None = the first one GET /v1/models lists
    model: str | None = None
    api_key: str | None = None
    dataset: str = "mixed"
    dataset_path: str | None = None
    num_prompts: int = 100
    num_warmups: int = 0
    max_concurrency: int | None = None
    request_rate: float = math.inf
    burstiness: float = 1.0
    seed: int = 0
    max_tokens: int = 256
    temperature: float = 0.0
    ignore_eos: bool = False
    #: extra JSON fields merged into every request body (e.g. top_p)
    extra_body: dict = field(default_factory=dict)
    #: milliseconds per key of `stats.GOODPUT_KEYS`
    goodput: dict[str, float] = field(default_factory=dict)
    percentiles: tuple[float, ...] = (99.0,)
    request_timeout: float = 600.0
    #: None = `base_url` + /metrics
    metrics_url: str | None = None
    progress: bool = True
    #: keep every request's timings in the result
    save_detailed: bool = False

    def __post_init__(self) -> None:
        self.base_url = normalize_base_url(self.base_url)
        if self.endpoint not in ENDPOINTS:
            raise BenchError(f"--endpoint must be one of {', '.join(ENDPOINTS)}, got {self.endpoint!r}")
        if self.dataset not in DATASETS:
            raise BenchError(f"--dataset must be one of {', '.join(DATASETS)}, got {self.dataset!r}")
        if self.num_prompts < 1:
            raise BenchError(f"--num-prompts must be >= 1, got {self.num_prompts}")
        if self.num_warmups < 0:
            raise BenchError(f"--num-warmups must be >= 0, got {self.num_warmups}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise BenchError(f"--max-concurrency must be >= 1, got {self.max_concurrency}")
        if not self.request_rate > 0:
            raise BenchError(f"--request-rate must be > 0 requests/s or inf, got {self.request_rate}")
        if not self.burstiness > 0:
            raise BenchError(f"--burstiness must be > 0, got {self.burstiness}")
        if self.max_tokens < 1:
            raise BenchError(f"--max-tokens must be >= 1, got {self.max_tokens}")
        if not 0 <= self.temperature <= 2:
            raise BenchError(f"--temperature must be in [0, 2], got {self.temperature}")
        if not self.request_timeout > 0:
            raise BenchError(f"--request-timeout must be > 0 seconds, got {self.request_timeout}")
        if any(not 0 <= p <= 100 for p in self.percentiles):
            raise BenchError(f"--percentiles must be in [0, 100], got {list(self.percentiles)}")
        bad = sorted(set(self.goodput) - set(GOODPUT_KEYS))
        if bad:
            raise BenchError(f"unknown goodput SLO keys {bad}; use {', '.join(GOODPUT_KEYS)}")

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def describe(self) -> dict:
        """The configuration as recorded in results (without the API key)."""
        d = asdict(self)
        d.pop("api_key")
        d.pop("progress")
        d["request_rate"] = "inf" if math.isinf(self.request_rate) else self.request_rate
        d["percentiles"] = list(self.percentiles)
        return d


def normalize_base_url(url: str) -> str:
    """`http://host:port`, `http://host:port/` and `http://host:port/v1` all mean the server root."""
    url = url.strip().rstrip("/")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    if not url.startswith(("http://", "https://")):
        raise BenchError(f"--base-url must start with http:// or https://, got {url!r}")
    return url


def arrival_offsets(num: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """Seconds after the start at which each request is sent: all at 0 for an
    infinite rate, else cumulative gamma(shape=burstiness, mean=1/rate) gaps."""
    if math.isinf(rate):
        return [0.0] * num
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(num):
        out.append(t)
        t += rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
    return out


def run_benchmark(config: LoadConfig, prompts: list[BenchPrompt] | None = None) -> dict:
    """Run one benchmark and return every figure with the configuration (JSON-ready).
    `prompts` (num_warmups + num_prompts of them) overrides the dataset."""
    if prompts is None:
        try:
            prompts = load_bench_prompts(config.dataset, config.dataset_path,
                                         config.num_warmups + config.num_prompts, config.seed)
        except DatasetError as e:
            raise BenchError(str(e)) from None
    if len(prompts) < config.num_warmups + config.num_prompts:
        raise BenchError(f"{len(prompts)} prompts given, {config.num_warmups + config.num_prompts} needed")
    return asyncio.run(_run(config, prompts))


async def _run(cfg: LoadConfig, prompts: list[BenchPrompt]) -> dict:
    timeout = httpx.Timeout(cfg.request_timeout, connect=30.0)
    limits = httpx.Limits(max_connections=cfg.max_concurrency, max_keepalive_connections=cfg.max_concurrency)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        model = cfg.model or await _first_model(client, cfg)
        url = cfg.base_url + ENDPOINTS[cfg.endpoint]

        def body(p: BenchPrompt) -> dict:
            return request_body(p, cfg.endpoint, model, cfg.max_tokens, cfg.temperature, cfg.ignore_eos,
                                cfg.extra_body)

        warmups, measured = prompts[: cfg.num_warmups], prompts[cfg.num_warmups: cfg.num_warmups + cfg.num_prompts]
        if warmups:
            done = await _send_all(client, url, [body(p) for p in warmups], cfg, [0.0] * len(warmups), None)
            if not any(r.success for r in done):
                raise BenchError(f"every warm-up request to {url} failed; the first error: {done[0].error}")
        before = await _spec_counters(client, cfg, model)
        offsets = arrival_offsets(len(measured), cfg.request_rate, cfg.burstiness, cfg.seed)
        bar = _progress(len(measured), cfg.progress)
        started_at = time.time()
        t0 = time.perf_counter()
        results = await _send_all(client, url, [body(p) for p in measured], cfg, offsets, bar)
        duration = time.perf_counter() - t0
        if bar is not None:
            bar.close()
        after = await _spec_counters(client, cfg, model)
    return {"config": {**cfg.describe(), "model": model},
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started_at)),
            **summarize_results(results, duration, cfg),
            "spec_decode": acceptance_between(before, after),
            "metrics_available": after is not None}


async def _first_model(client: httpx.AsyncClient, cfg: LoadConfig) -> str:
    url = cfg.base_url + "/v1/models"
    try:
        r = await client.get(url, headers=cfg.headers)
    except httpx.HTTPError as e:
        raise BenchError(f"cannot reach the server at {cfg.base_url} ({type(e).__name__}: {e}); "
                         "is it running, and is --base-url right?") from None
    if r.status_code != 200:
        raise BenchError(f"GET {url} answered HTTP {r.status_code}: {r.text[:300]}; pass --model "
                         "(and --api-key if the server needs one)")
    try:
        return r.json()["data"][0]["id"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise BenchError(f"GET {url} lists no model; pass --model") from None


async def _spec_counters(client: httpx.AsyncClient, cfg: LoadConfig, model: str) -> SpecDecodeCounters | None:
    try:
        r = await client.get(cfg.metrics_url or cfg.base_url + "/metrics", headers=cfg.headers)
    except httpx.HTTPError:
        return None
    return read_spec_counters(r.text, model) if r.status_code == 200 else None


async def _send_all(client: httpx.AsyncClient, url: str, bodies: list[dict], cfg: LoadConfig,
                    offsets: list[float], bar) -> list[RequestResult]:
    gate = asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency else None
    t0 = time.perf_counter()

    async def one(body: dict, offset: float) -> RequestResult:
        delay = t0 + offset - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if gate is None:
            res = await stream_request(client, url, body, cfg.headers)
        else:
            async with gate:
                res = await stream_request(client, url, body, cfg.headers)
        if bar is not None:
            bar.update(1)
        return res

    return list(await asyncio.gather(*(one(b, o) for b, o in zip(bodies, offsets))))


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="requests", unit="req", leave=False)


def summarize_results(results: list[RequestResult], duration: float, cfg: LoadConfig) -> dict:
    ok = [r for r in results if r.success]
    timings = [RequestTiming(r.ttft, r.e2el, r.output_tokens, r.itls) for r in ok]
    out_tokens = sum(r.output_tokens for r in ok)
    prompt_known = all(r.prompt_tokens is not None for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok) if prompt_known else None
    chunks = sum(r.text_chunks for r in ok)
    per_s = (lambda x: x / duration) if duration > 0 else (lambda x: None)
    errors = Counter(r.error for r in results if not r.success)
    out = {
        "duration_s": duration,
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "errors": dict(errors.most_common(10)),
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "output_tokens_from_usage": all(r.tokens_from_usage for r in ok),
        "request_throughput": per_s(len(ok)),
        "output_throughput": per_s(out_tokens),
        "total_token_throughput": per_s(out_tokens + in_tokens) if in_tokens is not None else None,
        "mean_tokens_per_chunk": out_tokens / chunks if chunks else None,
        "max_concurrent_requests": _peak_in_flight(results),
    }
    out.update(latency_figures(timings, duration, cfg.percentiles, cfg.goodput))
    if cfg.save_detailed:
        out["requests"] = [{"success": r.success, "error": r.error, "ttft_s": r.ttft, "e2el_s": r.e2el,
                            "output_tokens": r.output_tokens, "prompt_tokens": r.prompt_tokens,
                            "itls_s": r.itls} for r in results]
    return out


def _peak_in_flight(results: list[RequestResult]) -> int:
    events = sorted([(r.start, 1) for r in results] + [(r.end, -1) for r in results])
    peak = level = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return peak
