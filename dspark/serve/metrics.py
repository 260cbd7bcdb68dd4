"""The server's metrics: Prometheus families named like vLLM's (prefix `dspark:`) and
the periodic log line.

Everything here is fed by the engine thread, once per step, so counters move as
tokens are accepted rather than when requests finish; `/metrics` only reads.
Speculation counters count verification rounds that drafted at least one token
("drafts"), the draft tokens they verified, and the draft tokens the target
accepted, also per draft position (0-based, as vLLM labels them).
"""

from __future__ import annotations

import threading
import time

from dspark.engine.load_governor import OFF, ON
from dspark.engine.sequence import SpecStats

from .prometheus import Counter, Gauge, Histogram, render

PREFIX = "dspark:"
FINISH_REASONS = ("stop", "length", "abort")

# Bucket bounds in seconds, wide enough for a CPU (slow) and a GPU (fast).
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 320)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 2.5, 5, 10)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 240, 480, 960, 1920, 3840)


def stats_delta(now: SpecStats, before: SpecStats) -> SpecStats:
    """`now - before` for two snapshots of monotonically growing counters."""
    d = SpecStats(rounds=now.rounds - before.rounds, draft_tokens=now.draft_tokens - before.draft_tokens,
                  accepted_tokens=now.accepted_tokens - before.accepted_tokens)
    for k in range(len(now.drafted_per_position)):
        had = k < len(before.drafted_per_position)
        d.drafted_per_position.append(now.drafted_per_position[k] - (before.drafted_per_position[k] if had else 0))
        d.accepted_per_position.append(now.accepted_per_position[k] - (before.accepted_per_position[k] if had else 0))
    return d


class ServingMetrics:
    def __init__(self, model_name: str) -> None:
        c = {"model_name": model_name}
        p = PREFIX
        self.prompt_tokens = Counter(p + "prompt_tokens_total", "Prompt tokens prefilled.", const_labels=c)
        self.generation_tokens = Counter(p + "generation_tokens_total", "Tokens generated (emitted to requests).",
                                         const_labels=c)
        self.request_success = Counter(p + "request_success_total", "Requests finished, by finish reason.",
                                       ("finished_reason",), c)
        self.request_error = Counter(p + "request_error_total",
                                     "Accepted requests that ended with a server-side error.", const_labels=c)
        self.num_drafts = Counter(p + "spec_decode_num_drafts_total",
                                  "Verification rounds that drafted at least one token.", const_labels=c)
        self.num_draft_tokens = Counter(p + "spec_decode_num_draft_tokens_total",
                                        "Draft tokens sent to the target for verification.", const_labels=c)
        self.num_accepted_tokens = Counter(p + "spec_decode_num_accepted_tokens_total",
                                           "Draft tokens accepted by the target.", const_labels=c)
        self.accepted_per_pos = Counter(p + "spec_decode_num_accepted_tokens_per_pos_total",
                                        "Draft tokens accepted, by draft position (0-based).", ("position",), c)
        self.ttft = Histogram(p + "time_to_first_token_seconds",
                              "Seconds from request arrival to its first token.", TTFT_BUCKETS, c)
        self.itl = Histogram(p + "inter_token_latency_seconds",
                             "Seconds between consecutive tokens of a request; a step that emits k tokens "
                             "after an interval d counts k observations of d/k.", ITL_BUCKETS, c)
        self.e2e = Histogram(p + "e2e_request_latency_seconds",
                             "Seconds from request arrival to its end.", E2E_BUCKETS, c)
        self.running = Gauge(p + "num_requests_running", "Requests in the running batch.", const_labels=c)
        self.waiting = Gauge(p + "num_requests_waiting", "Requests waiting to be admitted.", const_labels=c)
        self.kv_usage = Gauge(p + "kv_cache_usage_perc",
                              "Fraction of per-request KV slots in use (1 = full).", const_labels=c)
        self.kv_slots_used = Gauge(p + "kv_slots_used", "KV slots held by requests (0 when idle; more is a leak).",
                                   const_labels=c)
        self.drafter_requests = Gauge(p + "spec_decode_drafter_requests",
                                      "Requests whose state the drafter holds (0 when idle; more is a leak).",
                                      const_labels=c)
        self.drafter_errors = Counter(p + "spec_decode_drafter_errors_total",
                                      "Drafter faults survived (a raising or non-finite draft, a failed context "
                                      "update); the requests concerned decoded without speculation.",
                                      const_labels=c)
        self.request_skips = Counter(p + "spec_decode_request_skips_total",
                                     "Request-steps left out of drafting because the scheduler verified "
                                     "nothing for the request on its last drafted steps (probed with backoff).",
                                     const_labels=c)
        self.lookup_tokens = Counter(p + "spec_decode_lookup_tokens_total",
                                     "Hybrid drafting: drafted tokens that came from prompt lookup.", const_labels=c)
        self.lookup_only = Counter(p + "spec_decode_lookup_only_requests_total",
                                   "Hybrid drafting: request-steps drafted by prompt lookup alone, the drafter "
                                   "left out by the scheduler (a lookup token costs no drafter time).",
                                   const_labels=c)
        self.lookup_ece = Gauge(p + "spec_decode_lookup_calibration_ece",
                                "Hybrid drafting: ECE of the lookup confidences against observed acceptance "
                                "since start-up (NaN before any lookup token was verified).", const_labels=c)
        self.lookup_history = Gauge(p + "spec_decode_lookup_history_tokens",
                                    "Tokens of earlier replies held for lookup (\"lookup_history\"; 0 without it).",
                                    const_labels=c)
        self.calibration_ece = Gauge(p + "spec_decode_calibration_ece",
                                     "ECE of the drafter's confidences against verification over the last 20000 "
                                     "verified draft tokens (NaN before any; a warning is logged above 0.1).",
                                     const_labels=c)
        self.predicted_acceptance = Gauge(p + "spec_decode_predicted_acceptance",
                                          "Mean confidence the drafter gave its tokens, by draft position "
                                          "(0-based; conditional on the earlier tokens being accepted).",
                                          ("position",), c)
        self.observed_acceptance = Gauge(p + "spec_decode_observed_acceptance",
                                         "Observed acceptance of draft tokens whose earlier tokens were accepted, "
                                         "by draft position, over the same window.", ("position",), c)
        self.threads = Gauge(p + "engine_threads", "CPU threads the engine's torch uses now (fewer while other "
                             "processes take cores).", const_labels=c)
        self.slow_windows = Counter(p + "step_time_slow_windows_total",
                                    "Windows of 16 steps that ran over 3x slower than the step-time table.",
                                    const_labels=c)
        self.table_refreshes = Counter(p + "step_time_table_refreshes_total",
                                       "Step-time table rescaled while serving: the median step over 128 steps "
                                       "was off by more than 1.5x with the CPU otherwise idle.", const_labels=c)
        self.prefix_queries = Counter(p + "prefix_cache_queries_total",
                                      "Prompt tokens of admitted requests looked up in the prefix cache.",
                                      const_labels=c)
        self.prefix_hits = Counter(p + "prefix_cache_hits_total",
                                   "Prompt tokens reused from the prefix cache (not computed).", const_labels=c)
        self.fallback_steps = Counter(p + "spec_decode_plain_fallback_steps_total",
                                      "Decode steps run as plain decoding because speculation measured slower "
                                      "than plain decoding at that load (the plain-decoding fallback).",
                                      const_labels=c)
        self.speculating = Gauge(p + "spec_decode_speculating",
                                 "Whether the plain-decoding fallback lets a load level speculate now (1) or "
                                 "not (0), by running requests (\"lo-hi\").", ("requests",), c)
        self.drafter_off_steps = Counter(p + "spec_decode_drafter_off_steps_total",
                                         "Decode steps that speculated without the drafter because it measured "
                                         "no faster than going without it at that load (the engine's drafter_or_lookup; "
                                         "hybrid drafting then looks up alone, a drafter alone decodes plain).",
                                         const_labels=c)
        self.drafter_on = Gauge(p + "spec_decode_drafter_on",
                                "Whether the engine's drafter_or_lookup runs the drafter at a load level now (1) or not "
                                "(0), by running requests (\"lo-hi\").", ("requests",), c)
        self.live_ratio = Gauge(p + "step_time_live_ratio",
                                "The live step-time curve over the profiled one, by token count (the counts "
                                "the engine has run recently).", ("tokens",), c)
        self._engine_seen = {"errors": 0, "lookup": 0, "lookup_only": 0, "slow": 0, "refreshes": 0, "skips": 0,
                             "fallback": 0, "drafter_off": 0, "prefix_queries": 0, "prefix_hits": 0}
        self._ece_at = float("-inf")
        #: position -> (predicted, observed, trials), refreshed with the gauges
        self.calibration_positions: dict[int, tuple[float, float, int]] = {}
        for reason in FINISH_REASONS:
            self.request_success.inc(0, finished_reason=reason)
        self._families = [self.prompt_tokens, self.generation_tokens, self.request_success, self.request_error,
                          self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens, self.accepted_per_pos,
                          self.ttft, self.itl, self.e2e, self.running, self.waiting, self.kv_usage,
                          self.kv_slots_used, self.drafter_requests,
                          self.drafter_errors, self.request_skips, self.threads, self.slow_windows,
                          self.table_refreshes, self.fallback_steps, self.speculating, self.drafter_off_steps,
                          self.drafter_on, self.live_ratio,
                          self.prefix_queries, self.prefix_hits]
        self._hybrid_families = [self.lookup_tokens, self.lookup_only, self.lookup_ece, self.lookup_history]
        self._calibration_families = [self.calibration_ece, self.predicted_acceptance, self.observed_acceptance]
        self.calibration_ece.set(float("nan"))
        self.hybrid = False
        self.window = LogWindow()

    # --- fed by the engine thread -------------------------------------------------
    def on_prefill(self, num_prompt_tokens: int) -> None:
        self.prompt_tokens.inc(num_prompt_tokens)
        self.window.add(prompt_tokens=num_prompt_tokens)

    def on_tokens(self, num_tokens: int, ttft: float | None, interval: float | None) -> None:
        """`num_tokens` emitted to one request; `ttft` for its first, else the
        `interval` since its previous emission."""
        if num_tokens <= 0:
            return
        self.generation_tokens.inc(num_tokens)
        self.window.add(generation_tokens=num_tokens)
        if ttft is not None:
            self.ttft.observe(ttft)
            if num_tokens > 1:  # the tokens after the first came in the same step
                self.itl.observe(0.0, num_tokens - 1)
        elif interval is not None:
            self.itl.observe(interval / num_tokens, num_tokens)

    def on_spec(self, delta: SpecStats) -> None:
        if delta.rounds == 0 and delta.draft_tokens == 0:
            return
        self.num_drafts.inc(delta.rounds)
        self.num_draft_tokens.inc(delta.draft_tokens)
        self.num_accepted_tokens.inc(delta.accepted_tokens)
        for k, n in enumerate(delta.accepted_per_position):
            self.accepted_per_pos.inc(n, position=k)
        self.window.add_spec(delta)

    def on_finished(self, reason: str, e2e: float) -> None:
        if reason == "error":
            self.request_error.inc()
        else:
            self.request_success.inc(finished_reason=reason)
        self.e2e.observe(e2e)

    def set_load(self, running: int, waiting: int, kv_slots_used: int, kv_slots: int,
                 drafter_requests: int = 0) -> None:
        self.running.set(running)
        self.waiting.set(waiting)
        self.kv_usage.set(kv_slots_used / kv_slots)
        self.kv_slots_used.set(kv_slots_used)
        self.drafter_requests.set(drafter_requests)

    def on_engine(self, engine) -> None:
        """Health counters of the engine (drafter faults, threads, slow steps, hybrid lookup)."""
        import torch

        runner, seen = engine.runner, self._engine_seen
        self.drafter_errors.inc(runner.drafter_errors - seen["errors"])
        seen["errors"] = runner.drafter_errors
        self.request_skips.inc(runner.gate.skipped - seen["skips"])
        seen["skips"] = runner.gate.skipped
        self.threads.set(torch.get_num_threads())
        watch = getattr(engine, "step_watch", None)
        if watch is not None:
            self.slow_windows.inc(watch.slow_windows - seen["slow"])
            seen["slow"] = watch.slow_windows
            self.table_refreshes.inc(watch.refreshes - seen["refreshes"])
            seen["refreshes"] = watch.refreshes
        prefix = runner.prefix
        if prefix is not None:
            self.prefix_queries.inc(prefix.tokens_queried - seen["prefix_queries"])
            seen["prefix_queries"] = prefix.tokens_queried
            self.prefix_hits.inc(prefix.tokens_saved - seen["prefix_hits"])
            seen["prefix_hits"] = prefix.tokens_saved
        drafter = runner.drafter
        now = time.monotonic()
        refresh = now - self._ece_at >= 1.0  # windowed figures: about once a second
        # steps with speculation off (plain decoding) and with the drafter off, and each
        # level's mode now
        for name, steps, mode, key in (("speculate_or_plain", self.fallback_steps, self.speculating, "fallback"),
                                       ("drafter_or_lookup", self.drafter_off_steps, self.drafter_on, "drafter_off")):
            governor = getattr(engine, name, None)
            if governor is None:
                continue
            n = governor.steps(OFF)
            steps.inc(n - seen[key])
            seen[key] = n
            if refresh:
                for level, st in governor.summary().items():
                    mode.set(1.0 if st["mode"] == governor.modes[ON] else 0.0, requests=level)
        live = getattr(engine, "live_table", None)
        if live is not None and refresh:
            ratio, fresh = live.target.ratio(), live.target.fresh()
            for count, r, f in zip(live.table.token_counts, ratio, fresh):
                if f:
                    self.live_ratio.set(float(r), tokens=str(count))
        if refresh and runner.calibration.observed:
            self.calibration_ece.set(runner.calibration.ece())
            # kept for the dashboard, which must not walk the window itself
            self.calibration_positions = runner.calibration.per_position()
            for k, (pred, obs, _) in self.calibration_positions.items():
                self.predicted_acceptance.set(pred, position=k)
                self.observed_acceptance.set(obs, position=k)
        if getattr(drafter, "lookup_enabled", False):
            self.hybrid = True
            n = drafter.counts["lookup_tokens"]
            self.lookup_tokens.inc(n - seen["lookup"])
            seen["lookup"] = n
            n = drafter.counts["lookup_only"]
            self.lookup_only.inc(n - seen["lookup_only"])
            seen["lookup_only"] = n
            history = getattr(drafter, "reply_history", None)
            self.lookup_history.set(len(history) if history is not None else 0)
            if refresh:
                self.lookup_ece.set(drafter.calibration.ece())
        if refresh:
            self._ece_at = now

    def render(self) -> str:
        return render(self._families + self._calibration_families + (self._hybrid_families if self.hybrid else []))


class LogWindow:
    """What happened since the last periodic log line."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reset(time.monotonic())

    def _reset(self, now: float) -> None:
        self.start = now
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.spec = SpecStats()

    def add(self, prompt_tokens: int = 0, generation_tokens: int = 0) -> None:
        with self._lock:
            self.prompt_tokens += prompt_tokens
            self.generation_tokens += generation_tokens

    def add_spec(self, delta: SpecStats) -> None:
        with self._lock:
            self.spec.merge(delta)

    def line(self, running: int, waiting: int, now: float | None = None) -> str | None:
        """The log line for the window ending now, and a fresh window; None when
        nothing happened and nothing is queued (an idle server stays quiet)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            idle = not (self.prompt_tokens or self.generation_tokens or running or waiting)
            elapsed = max(now - self.start, 1e-9)
            text = (f"prompt throughput {self.prompt_tokens / elapsed:.1f} tok/s, "
                    f"generation throughput {self.generation_tokens / elapsed:.1f} tok/s, "
                    f"running {running}, waiting {waiting}")
            s = self.spec
            if s.rounds:
                per_pos = ", ".join(f"{a:.3f}" for a in s.per_position_acceptance)
                text += (f"; speculative: mean acceptance length {s.acceptance_length:.2f}, "
                         f"accepted {s.accepted_tokens}/{s.draft_tokens} draft tokens in {s.rounds} drafts, "
                         f"per-position acceptance [{per_pos}]")
            self._reset(now)
        return None if idle else text
