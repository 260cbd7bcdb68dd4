"""One engine step: draft, choose verification lengths, verify in ONE target forward.

The target forward of a step carries, flattened, every running request's
[anchor, d_1..d_L] (its verification) and every newly admitted request's prompt
(its prefill). Prefill rows produce one sampled token (L = 0), verification rows go
through the rejection sampler; both through the same `rejection_sample` call, so a
request's randomness comes only from its own generator.

A drafter fault never takes the engine down: a `draft` call that raises, or returns
NaN/+inf logits or confidences outside [0, 1] for some rows, makes this step plain
decoding for the rows concerned (exact by construction); an `append_context` that
fails leaves the requests it could not take undrafted for the rest of their life.
Each fault is logged and counted in `drafter_errors`.

A request added with `speculate=False` never reaches the drafter: it decodes plain
(one token per step) in the same batched forwards as the speculating ones.
"""

from __future__ import annotations

import logging
import time

import torch

from dspark.drafters.base import Drafter
from dspark.runtime.batch import FlatBatch
from dspark.runtime.cpu_kernels import argmax_rows
from dspark.runtime.kv_cache import KVCachePool
from dspark.runtime.model import Transformer
from dspark.schedule.policies import VerifyLengthPolicy
from dspark.verify import rejection_sample

from .calibration_watch import CalibrationWatch
from .context_feed import ContextFeed
from .draft_choice import LOOKUP_GATE_FROM, DraftChoice
from .draft_gate import DraftGate
from .prefix_cache import PrefixCache
from .sequence import Sequence

log = logging.getLogger("dspark.engine")


class SpecRunner(DraftChoice):
    def __init__(
        self,
        model: Transformer,
        cache: KVCachePool,
        drafter: Drafter | None,
        policy: VerifyLengthPolicy,
        num_speculative_tokens: int,
    ) -> None:
        self.model = model
        self.cache = cache
        self.drafter = drafter
        self.policy = policy
        # settled by the engine (at most what the drafter drafts)
        self.num_speculative_tokens = num_speculative_tokens if drafter else 0
        self.hidden_layers = list(drafter.target_layer_ids) if drafter else []
        self.device = model.device
        #: the shape of the last step's work: tokens in its target forward, requests drafted for
        self.last_forward_tokens = 0
        self.last_drafted_requests = 0
        #: wall seconds of the last step's target forward, and of its drafting (0 if none)
        self.last_target_seconds = 0.0
        self.last_draft_seconds = 0.0
        #: whether the latest step drafted or looked up anything (its time outside the
        #: target and the drafter is then speculation's, `LiveStepTime.record_outside`)
        self.last_speculated = False
        #: the time it spent choosing what to verify besides the drafter's call: lookup,
        #: the policy, merging drafts
        self.last_select_seconds = 0.0
        self._draft_seconds = 0.0
        #: the drafter's catch-up on skipped context in the last step that drafted (seconds)
        self.last_catchup_seconds = self._catchup_seconds = 0.0
        self._num_drafted = 0
        self._probe_turn = 0
        #: False: this step decodes plain, drafting and lookup untouched (the engine's speculate_or_plain)
        self.speculating = True
        #: the verification length chosen for each running request in the last step
        self.last_verify_lengths: list[int] = []
        #: drafter faults survived (draft calls that raised or returned non-finite values,
        #: context updates that failed); requests whose drafter state is lost
        self.drafter_errors = 0
        self.undrafted: set[object] = set()
        #: requests whose drafter context was let go while the fallback decoded plain
        #: (`ContextFeed`): prompt lookup only from then on
        self.contextless: set[object] = set()
        #: requests the scheduler keeps verifying nothing for skip the drafter's block
        self.gate = DraftGate()
        #: ... from this many decoding requests (a drafter without weights costs little below)
        self.draft_gate_from = LOOKUP_GATE_FROM if getattr(drafter, "weightless", False) else 1
        #: False: the drafter does not run this step (the engine's drafter_or_lookup):
        #: hybrid drafting looks up alone, a drafter alone decodes the step plain
        self.drafter_on = True
        #: hybrid drafting: steps whose drafting lookup alone was priced above (a metric)
        self.priced_out = 0
        #: hybrid drafting: rows left out of drafting get prompt lookup alone
        self.lookup_rows = bool(getattr(drafter, "lookup_enabled", False))
        #: False: the drafter has no block to run (priced lookup): every row is a lookup row
        self.drafts_block = bool(getattr(drafter, "drafts_block", True))
        #: ... except, from LOOKUP_GATE_FROM requests, those whose lookup the scheduler keeps
        #: verifying nothing of (a lookup costs 40-70 us a request, 3 % of a 16-request step)
        self.lookup_gate, self.lookup_gate_from = DraftGate(), LOOKUP_GATE_FROM
        #: the drafter's confidences against verification, while serving
        self.calibration = CalibrationWatch()
        self._confidence: list[list[float] | None] | None = None  # this step's, per decode
        #: recent prompts' keys and values, for prompts that begin the same way (None: off)
        self.prefix: PrefixCache | None = None
        #: accepted tokens and their hidden states not given to the drafter yet
        #: (none without a drafter block: priced lookup reads each request's own tokens);
        #: a backlog that grows long while the drafter is off lets the drafter go for that request
        self.feed = ContextFeed(drafter, self.device, self.undrafted, self._fault, self.contextless,
                                feeding=lambda: self.speculating and self.drafter_on) \
            if drafter and self.drafts_block else None

    # --- lifecycle -------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        seq.slot = self.cache.allocate(seq.request_id)
        seq.generator = torch.Generator(device=self.device)
        seq.generator.manual_seed(seq.params.seed if seq.params.seed is not None else int(torch.seed() % 2**63))
        if self.drafter is not None and seq.speculate:
            try:
                self.drafter.add_request(seq.request_id)
                if seq.namespace is not None:
                    self.drafter.set_namespace(seq.request_id, seq.namespace)
            except Exception:
                self._fault("add_request")
                self.undrafted.add(seq.request_id)

    def reuse_prefix(self, seq: Sequence) -> int:
        """Fill a newly added request's slot with the longest prefix of its prompt that a
        kept prompt shares (its drafter context too, from the kept taps); returns where
        its prefill starts (0: nothing reused)."""
        if self.prefix is None or seq.slot < 0:
            return 0
        # a request of a plain-mode step lets the drafter go (`ContextFeed.let_go`): no taps
        # needed; nor for a drafter that reads no hidden states (prompt lookup)
        drafts = (self.drafter is not None and self.speculating and seq.speculate
                  and seq.request_id not in self.undrafted)
        needs_taps = drafts and bool(self.hidden_layers)
        entry, length = self.prefix.match(seq.prompt_ids, need_taps=needs_taps, namespace=seq.namespace)
        if entry is None:
            return 0
        taps = self.prefix.restore(seq.slot, entry, length)
        seq.num_cached = seq.num_prefilled = length
        seq.reused_taps = taps
        if drafts and self.feed is not None and (taps is not None or not needs_taps):
            # the drafter's context: the reused tokens (and their taps)
            self.feed.stash([seq.request_id], [seq.prompt_ids[:length]], [0], list(range(length)),
                            taps if needs_taps else None)
        return length

    def _keep_prompt(self, seq: Sequence, start: int, hidden: torch.Tensor | None) -> None:
        """A prompt whose prefill just completed, to the prefix cache; `hidden` its last
        chunk's taps (with the reused prefix's, the whole prompt's when that chunk began
        at 0 or where the reused prefix ended)."""
        taps = None
        if hidden is not None:
            if start == 0:
                taps = hidden
            elif seq.reused_taps is not None and seq.reused_taps.shape[0] == start \
                    and seq.reused_taps.shape[1:] == hidden.shape[1:]:
                taps = torch.cat([seq.reused_taps.to(hidden.dtype), hidden])
        seq.reused_taps = None
        self.prefix.store(seq.prompt_ids, seq.slot, taps, seq.namespace)

    def release(self, seq: Sequence) -> None:
        if seq.slot >= 0:
            self.cache.release(seq.request_id)
            seq.slot = -1
            if self.drafter is not None and seq.speculate:
                self.undrafted.discard(seq.request_id)
                self.contextless.discard(seq.request_id)
                if self.feed is not None:
                    self.feed.drop(seq.request_id)
                self.gate.release(seq.request_id)
                self.lookup_gate.release(seq.request_id)
                try:
                    self.drafter.remember_reply(seq.output_ids, seq.namespace)
                    self.drafter.release(seq.request_id)
                except Exception:
                    self._fault("release")

    # --- one step --------------------------------------------------------------
    def _fault(self, where: str, detail: str = "") -> None:
        self.drafter_errors += 1
        log.warning("drafter fault in %s%s; affected requests decode without speculation", where,
                    f" ({detail})" if detail else "", exc_info=not detail)

    @torch.inference_mode()
    def step(self, prefills: list[tuple[Sequence, int, int]], decodes: list[Sequence]) -> dict[object, list[int]]:
        """Advance every sequence by one round; returns request_id -> emitted tokens.
        `prefills` are (sequence, start, end) prompt chunks; a sequence emits its first
        token with its last chunk. The phases: draft and choose lengths, prepare the
        flat batch, one target forward, verify, commit (cache, sequences, drafter
        context)."""
        t0 = time.perf_counter()
        lengths, draft_tokens, draft_logits = self._verify_lengths(decodes, sum(end - start for _, start, end in prefills))
        chosen = time.perf_counter() - t0
        # the drafter's own call (its live curve); lookup, the policy and merging are speculation's overhead
        self.last_draft_seconds = self._draft_seconds if self._num_drafted else 0.0
        self.last_catchup_seconds = self._catchup_seconds if self._num_drafted else 0.0
        self.last_select_seconds = chosen - self.last_draft_seconds if self.last_speculated else 0.0
        prepared = self._prepare(prefills, decodes, lengths, draft_tokens)
        if prepared is None:
            return {}
        batch, tokens = prepared
        taps = self.hidden_layers
        if not self.speculating and self.feed is not None:
            # plain decoding by the fallback's call: no taps; these requests let the drafter go
            taps = []
            self.feed.let_go([s.request_id for s in decodes + [p[0] for p in prefills]
                              if s.speculate and s.request_id not in self.contextless])
        t1 = time.perf_counter()
        logits, hidden = self.model(batch, self.cache, taps)
        self.last_target_seconds = time.perf_counter() - t1
        finishing = [s for s, _, end in prefills if end == len(s.prompt_ids)]
        result = self._verify(logits, decodes + finishing, lengths + [0] * len(finishing), draft_tokens,
                              draft_logits)
        self._observe(decodes, lengths, result.num_accepted[: len(decodes)])
        return self._commit(decodes, prefills, tokens, lengths, batch, result, hidden)

    def _prepare(self, prefills: list[tuple[Sequence, int, int]], decodes: list[Sequence], lengths: list[int],
                 draft_tokens: torch.Tensor | list[list[int]] | None) -> tuple[FlatBatch, list[list[int]]] | None:
        """The flat batch of one forward: each decode's anchor and the drafts it
        verifies (all of their logits), each prompt chunk (the last logits of a
        prompt's last chunk)."""
        tokens: list[list[int]] = []
        starts: list[int] = []
        slots: list[int] = []
        logit_rows: list[int] = []
        row = 0
        drafted = draft_tokens.tolist() if isinstance(draft_tokens, torch.Tensor) else draft_tokens
        for i, (s, L) in enumerate(zip(decodes, lengths)):
            tokens.append([s.anchor] + (drafted[i][:L] if L else []))
            starts.append(s.num_cached)
            slots.append(s.slot)
            logit_rows.extend(range(row, row + L + 1))
            row += L + 1
        for s, start, end in prefills:
            tokens.append(s.prompt_ids[start:end])
            starts.append(start)
            slots.append(s.slot)
            row += end - start
            if end == len(s.prompt_ids):
                logit_rows.append(row - 1)
        if not tokens:
            return None
        self.last_forward_tokens = row
        self.last_drafted_requests = self._num_drafted if draft_tokens is not None else 0
        self.last_verify_lengths = lengths
        batch = FlatBatch.from_requests(tokens, starts, slots, logits="none", device=self.device)
        batch.logit_rows = torch.tensor(logit_rows, dtype=torch.long, device=self.device)
        return batch, tokens

    def _verify(self, logits: torch.Tensor, seqs: list[Sequence], lengths: list[int],
                draft_tokens: torch.Tensor | list[list[int]] | None, draft_logits: torch.Tensor | None):
        """Lossless rejection sampling of every sequence's verified drafts."""
        cu = [0]
        for L in lengths:
            cu.append(cu[-1] + L)
        if cu[-1] and isinstance(draft_tokens, list):  # lookup's proposals alone (`_lookup_lengths`)
            d_tok = torch.tensor([t for row, L in zip(draft_tokens, lengths) for t in row[:L]], dtype=torch.long)
            d_log = None
        elif cu[-1]:
            rows = [i for i, L in enumerate(lengths) for _ in range(L)]
            ks = [k for L in lengths for k in range(L)]
            d_tok = draft_tokens[rows, ks]
            # greedy verification reads the drafted tokens alone: their rows of draft logits
            # (a vocabulary each) are gathered only when a request samples
            sampled = draft_logits is not None and not all(s.params.greedy for s in seqs)
            d_log = draft_logits[rows, ks] if sampled else None
        else:
            d_tok = torch.zeros(0, dtype=torch.long)
            d_log = None
        return rejection_sample(logits, d_tok.to(self.device), None if d_log is None else d_log.to(self.device),
                                cu, [s.params for s in seqs], [s.generator for s in seqs], argmax_rows(logits))

    def _observe(self, decodes: list[Sequence], lengths: list[int], accepted: list[int]) -> None:
        """The round's outcome to the drafter (online learning) and the calibration watch."""
        if self.drafter is None or not any(lengths):
            return
        try:
            self.drafter.record_verification([s.request_id for s in decodes], lengths, accepted)
        except Exception:
            self._fault("record_verification")
        if self._confidence is not None:
            self.calibration.observe(self._confidence, lengths, accepted)

    def _commit(self, decodes: list[Sequence], prefills: list[tuple[Sequence, int, int]], tokens: list[list[int]],
                lengths: list[int], batch: FlatBatch, result, hidden: torch.Tensor | None) -> dict[object, list[int]]:
        """Keep what was accepted: the cache rolled back past it, the sequences
        advanced, the drafter fed the accepted tokens' hidden states. A prompt chunk
        that is not its prompt's last emits nothing."""
        emitted: dict[object, list[int]] = {}
        # a plain-mode step let every request's drafter context go (`ContextFeed.let_go`)
        feeding = self.feed is not None and self.speculating
        ctx_ids, ctx_tokens, ctx_starts, ctx_rows = [], [], [], []
        r = 0  # index into the verification result: decodes, then prompts' last chunks
        for i, s in enumerate(decodes + [p[0] for p in prefills]):
            first = batch.cu_seqlens[i]
            if i < len(decodes):
                a = result.num_accepted[r]
                kept = tokens[i][: a + 1]  # anchor + accepted drafts now have target states
                self.cache.truncate(s.slot, s.num_cached + a + 1)
                ctx_start = s.num_cached
                s.num_cached += a + 1
                s.stats.record(lengths[i], a)
            else:
                _, start, end = prefills[i - len(decodes)]
                kept = tokens[i]
                ctx_start = start
                s.num_cached = s.num_prefilled = end
                if self.prefix is not None and end == len(s.prompt_ids):
                    tapped = hidden is not None and hidden.shape[1] > 0  # a plain-mode step taps nothing
                    self._keep_prompt(s, start, hidden[first: first + len(kept)] if tapped else None)
            if feeding and s.speculate:
                ctx_starts.append(ctx_start)
                ctx_ids.append(s.request_id)
                ctx_tokens.append(kept)
                ctx_rows.extend(range(first, first + len(kept)))
            if s.prefilled:
                out = result.output_tokens[r]
                r += 1
                s.num_steps += 1
                s.anchor = out[-1]
                emitted[s.request_id] = out
        if feeding:
            self.feed.stash(ctx_ids, ctx_tokens, ctx_starts, ctx_rows, hidden)
        return emitted

