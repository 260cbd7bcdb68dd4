"""The engine: continuous batching around `SpecRunner`.

Requests wait in a bounded queue, are admitted while KV slots, `max_num_seqs` and
the per-step prefill budget allow, and leave as soon as they finish or are aborted.
`step()` runs one target forward for every running request (verification) plus
prompt chunks within the budget (prefill: a long prompt takes several steps, while
the others keep decoding) and returns what each request emitted. The engine
knows nothing of HTTP; it detokenizes only to honour stop strings.

`recent_steps` keeps the shape and time of the last steps (a ring buffer of small
tuples, one append per step) for whoever wants to watch the scheduler work.
"""

from __future__ import annotations

import copy
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from dspark.drafters.build import drafter_from_spec
from dspark.errors import UserError
from dspark.runtime.kv_cache import ContextTooLong
from dspark.runtime.precision import BATCH_INVARIANT_CPU
from dspark.runtime.target import Target
from dspark.sampling import SamplingParams, StopRule
from dspark.schedule.policies import make_policy

from .config import EngineConfig, SpeculativeConfig
from .prefix_cache import PrefixCache
from .runner import SpecRunner
from .sequence import Sequence, SpecStats, Status


class QueueFull(RuntimeError):
    """The waiting queue is at its configured bound; retry later."""


#: steps kept in `LLMEngine.recent_steps`
RECENT_STEPS = 512


@dataclass(frozen=True)
class StepRecord:
    """One engine step as a watcher sees it."""

    end: float  # time.monotonic() at its end
    seconds: float  # wall time of the step (drafting, forward, verification)
    forward_tokens: int  # tokens in its target forward
    drafted_requests: int  # requests drafted for (0: the drafter did not run)
    verify_lengths: tuple[int, ...]  # draft tokens verified, per decoding request
    emitted_tokens: int  # tokens emitted to requests
    #: per decoding request (as `verify_lengths`), its owner and the tokens emitted to it;
    #: what the live view shows a tenant of its own requests
    owners: tuple[str | None, ...] = ()
    emitted: tuple[int, ...] = ()


@dataclass
class StepOutput:
    seq: Sequence
    new_tokens: list[int]
    finished: bool


def _speculate_or_plain(spec) -> "LoadGovernor | None":
    """The plain-decoding fallback `spec` asks for, or None (its step cost is set once
    the engine has the step-time table)."""
    if spec is None or not spec.plain_fallback:
        return None
    from .load_governor import LoadGovernor

    pf = spec.plain_fallback
    return LoadGovernor(from_requests=None if pf is True else int(pf), trials_from=spec.plain_trials_from)


class LLMEngine:
    def __init__(self, target: Target, spec=None, config: EngineConfig | None = None, step_table=None) -> None:
        self.target = target
        self.config = config or EngineConfig()
        self.spec: SpeculativeConfig | None = spec
        cache = target.new_cache(self.config.max_num_seqs, self.config.max_model_len)
        drafter = None
        if spec is not None and (spec.policy != "none"):
            drafter = drafter_from_spec(spec, target)
            drafter.reserve(self.config.max_num_seqs, self.config.max_model_len + 1)
        # the one place the verification length is settled: as asked, at most what the drafter drafts
        n = min(spec.num_speculative_tokens or drafter.max_draft_tokens, drafter.max_draft_tokens) \
            if drafter else 0
        governor = _speculate_or_plain(spec) if target.device.type == "cpu" else None
        if drafter is None:
            policy = make_policy("none")
        else:
            # the scheduler prices with the step-time table; the governor scores with it
            # (any policy: prompt lookup's fixed verification too), where it governs a load
            # level this engine can reach (`dspark generate` runs one request)
            governed = governor is not None and governor.governs(self.config.max_num_seqs)
            if (spec.policy in ("dspark-sync", "dspark-async") or governed) and step_table is None:
                from dspark.profiling.tables import load_or_profile

                step_table = load_or_profile(target, drafter, self.config.max_num_seqs, n)
            policy = make_policy(spec.policy, table=step_table, num_speculative_tokens=n,
                                 threshold=spec.confidence_threshold, lag=spec.async_lag,
                                 probe_every=spec.draft_probe_every)
        self.runner = SpecRunner(target.model, cache, drafter, policy, n)
        if self.config.prefix_caching and target.device.type == "cpu" and target.precision in BATCH_INVARIANT_CPU:
            self.runner.prefix = PrefixCache(cache)
        self.policy = policy
        self.step_table = step_table
        #: the profile as measured, never corrected: the governor's unit (a plain step's
        #: time; the live table learns a count while plain decoding runs it, and the two
        #: modes' scores must not be taken against different references) and, with a live
        #: table, the step watch's reference
        self._profile = None if step_table is None else copy.deepcopy(step_table)
        self.step_watch = None
        #: the table corrected by measured steps (CPU only: there a forward's wall time is its cost)
        self.live_table = None
        #: whether a step speculates at all at this load, or decodes plainly, by measured
        #: throughput (CPU only, with a table; dspark.engine.load_governor)
        self.speculate_or_plain = None
        #: wherever a step speculates: whether the learned drafter runs, or the step goes
        #: without it (prompt lookup alone with hybrid drafting, else plain decoding's
        #: step), by measured throughput (the drafter must beat its absence by ON_MARGIN),
        #: scored on the steps between speculate_or_plain's trials
        self.drafter_or_lookup = None
        if target.device.type == "cpu":
            from dspark.profiling.watch import StepWatch

            if step_table is not None and spec is not None and spec.live_step_time:
                from dspark.schedule.live import LiveStepTime

                self.live_table = LiveStepTime(step_table)
            if step_table is not None and governor is not None:
                governor.step_cost = step_table.target_time
                self.speculate_or_plain = governor
                if self.runner.drafts_block:
                    from .load_governor import LoadGovernor

                    # hybrid drafting: every level starts with lookup alone and runs the
                    # drafter once a trial shows it pays there (the first after the fourfold
                    # gap of a level that starts "plain"). On the CPUs measured the drafter
                    # alone ran below plain decoding at one request (0.966-0.986x), and the
                    # hybrid that ran it first there ran 0.5-1.3 % below the hybrid that
                    # runs lookup first (docs/journal.md: its trials'
                    # drafter-on stretches cost more than they found). A drafter alone runs
                    # first everywhere (off, its steps are plain decoding's, which the
                    # fallback's own trials cover at its levels)
                    if self.runner.lookup_rows:
                        self.drafter_or_lookup = LoadGovernor(from_requests=1, modes=("drafter", "lookup"))
                    else:
                        self.drafter_or_lookup = LoadGovernor(modes=("drafter", "plain"))
            # with a table: against the profile (and it keeps the table true, unless the
            # live table does that: then against a copy of the profile, so that a slowdown
            # the live table learns still shows); without one (plain decoding): against
            # the fastest steps seen so far
            watched = step_table if self.live_table is None else self._profile
            self.step_watch = StepWatch(watched, rescale=self.live_table is None)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.stats = SpecStats()  # finished requests' counters, for metrics
        self.num_finished = 0
        self.recent_steps: deque[StepRecord] = deque(maxlen=RECENT_STEPS)

    # --- requests --------------------------------------------------------------
    def add_request(self, prompt_ids: list[int], params: SamplingParams, request_id: object | None = None,
                    speculate: bool = True, namespace: str | None = None, owner: str | None = None) -> Sequence:
        """Queue a request; `speculate=False` decodes it without drafts (exact either way).
        `namespace`: the part of the prefix cache and the reply history it may read and
        add to (None: the shared one); `owner`: whose it is in the live view."""
        if not prompt_ids:
            raise UserError("the prompt is empty")
        if len(prompt_ids) >= self.config.max_model_len:
            raise ContextTooLong(
                f"the prompt has {len(prompt_ids)} tokens; the maximum model length is "
                f"{self.config.max_model_len} (prompt + at least one output token)"
            )
        if len(self.waiting) >= self.config.max_waiting:
            raise QueueFull(f"the waiting queue is full ({self.config.max_waiting} requests)")
        seq = Sequence(list(prompt_ids), params, speculate=speculate, namespace=namespace, owner=owner)
        if request_id is not None:
            seq.request_id = request_id
        self.waiting.append(seq)
        return seq

    def abort(self, request_id: object, error: str | None = None) -> bool:
        """Finish a waiting or running request now and free its KV slot. With `error`
        it finishes with reason "error" and `seq.error` set (a server-side fault)."""
        reason = "abort" if error is None else "error"
        for seq in list(self.waiting):
            if seq.request_id == request_id:
                self.waiting.remove(seq)
                seq.error = error
                self._finish(seq, reason)
                return True
        for seq in self.running:
            if seq.request_id == request_id:
                seq.error = error
                self._finish(seq, reason)
                self.running.remove(seq)
                return True
        return False

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # --- stepping --------------------------------------------------------------
    def _prefill_chunks(self) -> tuple[list[tuple[Sequence, int, int]], list[Sequence]]:
        """This step's prefill work within `max_prefill_tokens`: the next chunk of every
        partly prefilled request (admission order), then newly admitted requests while
        KV slots, `max_num_seqs` and the budget allow. Returns ((seq, start, end)
        prompt chunks, the newly admitted)."""
        budget = self.config.max_prefill_tokens
        chunks: list[tuple[Sequence, int, int]] = []
        for seq in self.running:
            if budget <= 0:
                break
            if not seq.prefilled:
                end = min(len(seq.prompt_ids), seq.num_prefilled + budget)
                chunks.append((seq, seq.num_prefilled, end))
                budget -= end - seq.num_prefilled
        admitted: list[Sequence] = []
        while (budget > 0 and self.waiting and len(self.running) + len(admitted) < self.config.max_num_seqs
               and self.runner.cache.num_free > 0):
            seq = self.waiting.popleft()
            self.runner.add(seq)
            seq.status = Status.RUNNING
            start = self.runner.reuse_prefix(seq)  # 0 unless a kept prompt begins the same way
            end = min(len(seq.prompt_ids), start + budget)
            chunks.append((seq, start, end))
            budget -= end - start
            admitted.append(seq)
        return chunks, admitted

    def step(self) -> list[StepOutput]:
        decodes = [s for s in self.running if s.prefilled]
        runner = self.runner
        if self.speculate_or_plain is not None:
            # Before admission (a prompt reused in plain mode needs no taps), and at the load
            # the step's requests are about to decode at: prompts that arrive together after
            # the previous batch finished (decodes empty) belong to their own level, not to
            # the ungoverned one of no requests, which would tap them for a drafter that
            # the level's plain decoding will let go. (Never fewer than the decodes: they
            # are running, and at most max_num_seqs run.)
            soon = min(len(self.running) + len(self.waiting), self.config.max_num_seqs)
            was = runner.speculating
            runner.speculating = self.speculate_or_plain.on(soon)
            if self.drafter_or_lookup is not None and runner.speculating:  # (a plain step drafts nothing)
                runner.drafter_on = self.drafter_or_lookup.on(soon)
            if runner.speculating and not was and self.live_table is not None:
                self.live_table.publish()  # plain-mode steps were recorded unpublished
        chunks, admitted = self._prefill_chunks()
        if not chunks and not decodes:
            return []
        # Admitted before the forward, so that after a failed step every request it
        # touched is in `running` and can be aborted (freeing its slot).
        self.running.extend(admitted)
        t0 = time.perf_counter()
        emitted = self.runner.step(chunks, decodes)
        seconds = time.perf_counter() - t0
        if self.step_watch is not None:
            self.step_watch.record(runner.last_forward_tokens, runner.last_drafted_requests, seconds)
        if not chunks and decodes:
            if self.live_table is not None:
                self.live_table.record(runner.last_forward_tokens, runner.last_target_seconds,
                                       runner.last_drafted_requests, runner.last_draft_seconds,
                                       publish=runner.speculating)
                self.live_table.record_outside(len(decodes), runner.last_speculated,
                                               seconds - runner.last_target_seconds - runner.last_draft_seconds,
                                               runner.last_select_seconds, runner.last_drafted_requests > 0,
                                               runner.last_catchup_seconds)
            if self.speculate_or_plain is not None:
                n, out = len(decodes), sum(len(emitted[s.request_id]) for s in decodes)
                plain = self._profile.target_time(n)
                gov = self.speculate_or_plain
                gov.record(n, out, seconds, plain, self._profile.target_time(runner.last_forward_tokens))
                if self.drafter_or_lookup is not None and runner.speculating and not (
                        gov.governs(n) and gov.level(n).trialing):
                    self.drafter_or_lookup.record(n, out, seconds, plain)  # the speculation gaps' steps
        self.recent_steps.append(StepRecord(time.monotonic(), seconds, runner.last_forward_tokens,
                                            runner.last_drafted_requests, tuple(runner.last_verify_lengths),
                                            sum(len(t) for t in emitted.values()),
                                            tuple(s.owner for s in decodes),
                                            tuple(len(emitted[s.request_id]) for s in decodes)))
        outputs = []
        for seq in decodes + [s for s, _, end in chunks if end == len(s.prompt_ids)]:
            new = self._append(seq, emitted[seq.request_id])
            outputs.append(StepOutput(seq, new, seq.is_finished))
        self.running = [s for s in self.running if not s.is_finished]
        return outputs

    def _append(self, seq: Sequence, tokens: list[int]) -> list[int]:
        rule = self._stop_rule(seq)
        new: list[int] = []
        for t in tokens:
            if rule.stop_token(t):
                seq.stop_token_id = t
                self._finish(seq, "stop")
                break
            new.append(t)
            seq.output_ids.append(t)
            if len(seq.output_ids) >= seq.params.max_tokens:
                self._finish(seq, "length")
                break
            if seq.num_tokens >= self.config.max_model_len:
                self._finish(seq, "length")
                break
        if not seq.is_finished and rule.stop_strings and rule.hit_string(self.target.tokenizer.decode(seq.output_ids)):
            self._finish(seq, "stop")
        return new

    def _finish(self, seq: Sequence, reason: str) -> None:
        if seq.is_finished:
            return
        seq.status = Status.FINISHED
        seq.finish_reason = reason
        self.runner.release(seq)
        self.stats.merge(seq.stats)
        self.num_finished += 1

    def _stop_rule(self, seq: Sequence) -> StopRule:
        if seq.stop_rule is None:
            eos = () if seq.params.ignore_eos else self.target.tokenizer.eos_token_ids
            seq.stop_rule = StopRule(seq.params, eos)
        return seq.stop_rule

    def final_text(self, seq: Sequence) -> str:
        """The request's text, cut before its first stop string."""
        return self._stop_rule(seq).cut_text(self.target.tokenizer.decode(seq.output_ids))

    # --- offline API -----------------------------------------------------------
    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]) -> list[Sequence]:
        """Run prompts to completion (continuous batching); results in input order."""
        plist = params if isinstance(params, list) else [params] * len(prompts)
        pending = list(zip(prompts, plist))[::-1]
        seqs: list[Sequence] = []
        while pending or self.has_unfinished():
            while pending and len(self.waiting) < self.config.max_waiting:
                seqs.append(self.add_request(*pending.pop()))
            self.step()
        return seqs

    def run(self, requests: Iterable[tuple[object, list[int], SamplingParams]]) -> Iterator[Sequence]:
        """Decode (request_id, prompt_ids, params) triples read lazily from `requests`,
        admitted as batch slots free up; yields each Sequence as it finishes (bulk
        generation: any number of requests, memory for `max_num_seqs` of them)."""
        pending = iter(requests)
        exhausted = False
        while True:
            while not exhausted and len(self.waiting) + len(self.running) < self.config.max_num_seqs:
                item = next(pending, None)
                if item is None:
                    exhausted = True
                    break
                rid, prompt_ids, params = item
                self.add_request(prompt_ids, params, request_id=rid)
            if not self.has_unfinished():
                return
            for out in self.step():
                if out.finished:
                    yield out.seq

    def total_stats(self) -> SpecStats:
        total = SpecStats()
        total.merge(self.stats)
        for s in self.running:
            total.merge(s.stats)
        return total
