"""The first phase of an engine step: which requests draft, which look up, and how many
tokens each verifies (`DraftChoice._verify_lengths`, mixed into `SpecRunner`).

The drafter drafts the rows the policy and the per-request draft gate let through; with
hybrid drafting (and priced lookup, which has no drafter block) the other rows get
prompt lookup alone, and a step with lookup rows only is priced on the target's time
alone (`free_lengths`). Every choice rests on earlier steps' outcomes and this step's
proposals as the policies allow (see dspark.schedule.policies), so verification stays
lossless; a drafter fault makes the step plain decoding for the rows concerned.
"""

from __future__ import annotations

import time

import torch

from dspark.drafters.base import DraftRequest
from dspark.schedule.lookup_pricing import best_rate, free_lengths

from .drafts import faulty_rows, merge_drafts
from .sequence import Sequence

#: requests drafted on a probe step (the policy drafts to re-measure, not because it pays)
PROBE_ROWS = 4
#: decoding requests from which the lookup gate (and the draft gate of prompt lookup's
#: n-gram drafter) holds requests back: below, a lookup costs about 0.1 ms and the gates'
#: closed stretches missed copies (docs/journal.md, "the lookup gates from two requests":
#: ngram_gate_ab.txt; at two requests the gate read level or ahead, gate_c2.txt)
LOOKUP_GATE_FROM = 2


class DraftChoice:
    """`SpecRunner`'s drafting and length choice (the attributes are the runner's)."""

    def _verify_lengths(self, decodes: list[Sequence],
                        prefill_tokens: int = 0) -> tuple[list[int], torch.Tensor | None, torch.Tensor | None]:
        """Draft and choose every decode's verification length. The drafter drafts the
        rows the policy and the per-request gate let through; with hybrid drafting the
        other rows get prompt lookup alone (no drafter time), and a step with lookup
        rows only is priced on the target's time alone (`free_lengths`)."""
        none = [0] * len(decodes), None, None
        self._confidence = None
        self._num_drafted = 0
        self.last_speculated = False
        n = self.num_speculative_tokens
        if not decodes or n == 0 or not self.speculating:
            return none
        drafting = self.drafts_block and self.drafter_on and self.policy.should_draft(len(decodes), n)
        live = [i for i, s in enumerate(decodes) if s.speculate and s.request_id not in self.undrafted]
        gate = len(decodes) >= self.draft_gate_from
        rows = [i for i in live if drafting and decodes[i].request_id not in self.contextless
                and (not gate or self.gate.wants_draft(decodes[i].request_id))]
        if len(rows) > PROBE_ROWS and self.policy.probing:
            # a probe (drafting has not paid lately): a few requests, in turn, refresh the
            # survivals the next decision rests on; all of them would cost a full draft
            self._probe_turn = (self._probe_turn + PROBE_ROWS) % len(rows)
            rows = sorted((rows + rows)[self._probe_turn: self._probe_turn + PROBE_ROWS])
        if rows and self.lookup_rows and not getattr(self.policy, "probing", False):
            rows = self._drafting_over_lookup(decodes, rows, n, prefill_tokens)
        # The drafter's catch-up on the tokens accepted while it was skipped is not timed
        # as its call: it grows with the skipped stretch, and charged to the live curve it
        # kept the drafter off longer (docs/journal.md, 2026-12-05); it falls on speculation's
        # per-step overhead instead, like the tokens it covers.
        self._catchup_seconds = 0.0
        if rows:
            t = time.perf_counter()
            self.feed.flush([decodes[i].request_id for i in rows])
            self._catchup_seconds = time.perf_counter() - t
            rows = [i for i in rows if decodes[i].request_id not in self.undrafted]  # a failed flush
        looked = []
        if self.lookup_rows:
            taken = set(rows)
            gated = len(decodes) >= self.lookup_gate_from
            looked = [i for i in live if i not in taken and decodes[i].request_id not in self.undrafted
                      and (not gated or self.lookup_gate.wants_draft(decodes[i].request_id))]
        if not rows and not looked:
            return none
        if not rows:
            return self._lookup_lengths(decodes, looked, n, prefill_tokens)
        self._num_drafted = len(rows)
        self.last_speculated = True
        out, bad, lk = None, set(), None
        try:
            self._draft_seconds = 0.0
            if rows:
                t = time.perf_counter()
                out = self.drafter.draft(
                    [DraftRequest(decodes[i].request_id, decodes[i].anchor, decodes[i].num_cached, decodes[i].params,
                                  decodes[i].generator) for i in rows],
                    n,
                )
                self._draft_seconds = time.perf_counter() - t
            if looked:
                lk = self.drafter.lookup_only([decodes[i].request_id for i in looked],
                                              [(decodes[i].prompt_ids, decodes[i].output_ids) for i in looked], n)
        except Exception:
            self._fault("draft")
            return none
        if out is not None:
            bad = faulty_rows(out, [decodes[i].params.greedy for i in rows])
            if bad:
                self._fault("draft", f"non-finite logits or confidences for {len(bad)} of {len(rows)} requests")
        block = merge_drafts(len(decodes), rows, out, looked, lk)
        order = rows + looked
        g = block.tokens.shape[1]
        if block.confidence is not None:
            conf = block.confidence[order].float().nan_to_num(0.0).clamp(0.0, 1.0)
            survival = torch.cumprod(conf, dim=1)  # [R, G]
            self._confidence = [None] * len(decodes)
            for i, row in zip(rows, conf[: len(rows)].tolist()):  # the drafter's own, for its calibration
                self._confidence[i] = row
        else:
            survival = torch.ones(len(order), g)
        chosen = self._choose(survival, bool(rows), len(decodes) - len(order), prefill_tokens)
        lengths = [0] * len(decodes)
        for j, i in enumerate(order):
            s = decodes[i]
            lengths[i] = 0 if j in bad else self._capped(s, int(chosen[j]), min(g, block.valid[i]))
            if j < len(rows):
                self.gate.record(s.request_id, lengths[i])
            else:
                self.lookup_gate.record(s.request_id, lengths[i])
        return lengths, block.tokens, block.logits

    def _drafting_over_lookup(self, decodes: list[Sequence], rows: list[int], n: int,
                              prefill_tokens: int) -> list[int]:
        """`rows`, or none of them where lookup alone is expected to do at least as well
        this step: where some row's lookup matched, the best expected tokens per second
        of its proposals alone (target time only) against the hybrid block's estimate
        (`survivals_with_and_without`, drafter time included). Lookup's proposals are a
        function of the context and the estimate of earlier steps, so this stays
        lossless; the rows then get lookup alone (no drafter call, no catch-up)."""
        table = getattr(self.policy, "table", None)
        price = getattr(self.drafter, "survivals_with_and_without", None)
        if table is None or price is None:
            return rows
        priced = price([decodes[i].request_id for i in rows],
                       [(decodes[i].prompt_ids, decodes[i].output_ids) for i in rows], n)
        if priced is None or not any(s[0] > 0.0 for s in priced[0]):
            return rows  # nothing matched: drafting against plain decoding is the policy's call
        others = len(decodes) - len(rows)
        if best_rate(priced[0], table, False, others, prefill_tokens) >= \
                best_rate(priced[1], table, True, others, prefill_tokens):
            self.priced_out += 1
            return []
        return rows

    def _lookup_lengths(self, decodes: list[Sequence], looked: list[int], n: int,
                        prefill_tokens: int) -> tuple[list[int], list[list[int]] | None, None]:
        """A step that only looks up: lookup's proposals and their verification lengths
        (`free_lengths`) in plain Python, the proposals as lists (a step's dozen tensor
        operations on a few values cost about as much as the lookup itself)."""
        none = [0] * len(decodes), None, None
        self.last_speculated = True
        self._draft_seconds = 0.0
        try:
            found, confs = self.drafter.lookup_lists([decodes[i].request_id for i in looked],
                                                     [(decodes[i].prompt_ids, decodes[i].output_ids)
                                                      for i in looked], n)
        except Exception:
            self._fault("draft")
            return none
        survival = []
        for c in confs:
            s, row = 1.0, []
            for x in c:
                s *= min(max(x, 0.0), 1.0) if x == x else 0.0  # NaN: no confidence
                row.append(s)
            survival.append(row + [0.0] * (n - len(row)))
        chosen = self._choose(survival, False, len(decodes) - len(looked), prefill_tokens)
        lengths = [0] * len(decodes)
        tokens: list[list[int]] = [[] for _ in decodes]
        for j, i in enumerate(looked):
            s = decodes[i]
            lengths[i] = self._capped(s, int(chosen[j]), len(found[j]))
            tokens[i] = found[j]
            self.lookup_gate.record(s.request_id, lengths[i])
        return lengths, tokens, None

    def _choose(self, survival, drafted: bool, others: int, prefill_tokens: int) -> list[int]:
        """The policy's lengths for the proposals' survivals. A table-priced policy prices
        the whole forward (`others`: the decodes verifying nothing; the prompt chunks), and
        a step without a drafter's rows on the target's time alone (`free_lengths`)."""
        table = getattr(self.policy, "table", None)
        if table is None:
            return self.policy.choose(survival)
        if drafted:
            return self.policy.choose(survival, others, prefill_tokens)
        return free_lengths(survival, table, others, prefill_tokens)

    def _capped(self, s: Sequence, chosen: int, proposed: int) -> int:
        """A chosen length within what was proposed, the request's token budget and the
        cache. The caps depend only on lengths known before drafting, so clamping stays
        lossless."""
        return max(min(chosen, proposed, s.params.max_tokens - len(s.output_ids) - 1,
                       self.cache.max_len - s.num_cached - 1), 0)
