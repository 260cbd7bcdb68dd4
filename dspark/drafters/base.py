"""The contract between the speculative loop and every drafter.

Vocabulary of one round for request r (positions are absolute token positions):

* the target KV cache holds tokens 0..P-1; the *anchor* is the last emitted token, at
  position P, not yet run through the target;
* the drafter has seen the target's tapped hidden states of tokens 0..P-1 (its
  *context*, fed through `append_context`);
* `draft` proposes tokens for positions P+1..P+num_tokens;
* the target verifies [anchor, d_1..d_L] in one forward; a tokens are accepted, so
  tokens P..P+a (anchor + accepted drafts) now have target hidden states, which the
  loop hands to `append_context`; the bonus/recovered token becomes the next anchor.

A drafter never sees the target model's forward; the loop gives it hidden states
(`target_layer_ids`: -1 = embeddings, i = output of decoder layer i) and it reuses
the target's embedding and LM head passed at construction.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dspark.sampling import SamplingParams


@dataclass
class DraftRequest:
    request_id: object
    anchor_token: int
    anchor_position: int  # P: equals the number of context tokens appended so far
    params: SamplingParams
    generator: torch.Generator | None


@dataclass
class DraftOutput:
    """Proposals for a batch of R requests, each `num_tokens` long.

    `logits` are the final draft logits q_k *before* temperature/top-k/top-p (the
    verifier applies the same transform to target and draft); for DSpark they
    include the Markov bias of the token actually drafted at k-1. `logits` is None
    for deterministic proposers (n-gram), which the verifier treats as one-hot q.
    `confidence` is c_k in (0, 1) (None for drafters without a confidence head);
    survival s_k = prod_{j<=k} c_j is computed by the caller.
    `num_valid` is how many leading tokens of each row are real proposals (None: all
    `num_tokens`). Only proposers that can run out of tokens set it (n-gram: no
    earlier match, or a match near the end); the rest of such a row is -1 and must
    not be verified.
    `num_lookup` (hybrid drafting only) is how many leading tokens of each row came
    from prompt lookup, with a point-mass q (their `logits` row is 0 at the token and
    -inf elsewhere).
    """

    tokens: torch.Tensor  # [R, num_tokens] int64
    logits: torch.Tensor | None  # [R, num_tokens, vocab]
    confidence: torch.Tensor | None = None  # [R, num_tokens]
    num_valid: torch.Tensor | None = None  # [R] int64
    num_lookup: torch.Tensor | None = None  # [R] int64


def stack_drafts(num_rows: int, parts: list[tuple[list[int], DraftOutput]]) -> DraftOutput:
    """One [num_rows, ...] block from proposals for disjoint row sets, e.g. the drafter's
    rows and prompt lookup's. Rows no part covers propose nothing (`num_valid` 0).
    Logits are kept when some part has them; a part without them (a deterministic
    proposer) gets point masses there, 0 at each valid token and -inf elsewhere.
    Confidences are kept when every part has them. `num_valid` is always set;
    `num_lookup` when some part sets it (a part without it counts 0 lookup tokens)."""
    parts = [(idx, out) for idx, out in parts if idx]
    if not parts:
        raise ValueError("stack_drafts needs at least one non-empty part")
    first = parts[0][1]
    g, dev = first.tokens.shape[1], first.tokens.device
    with_logits = [out.logits for _, out in parts if out.logits is not None]
    tokens = torch.full((num_rows, g), -1, dtype=torch.long, device=dev)
    logits = None
    if with_logits:
        ref = with_logits[0]
        logits = torch.full((num_rows, g, ref.shape[-1]), float("-inf"), dtype=ref.dtype, device=dev)
    with_conf = all(out.confidence is not None for _, out in parts)
    conf = torch.zeros(num_rows, g, device=dev) if with_conf else None
    valid = torch.zeros(num_rows, dtype=torch.long, device=dev)
    any_lookup = any(out.num_lookup is not None for _, out in parts)
    lookup = torch.zeros(num_rows, dtype=torch.long, device=dev) if any_lookup else None
    for idx, out in parts:
        at = torch.tensor(idx, dtype=torch.long, device=dev)
        tokens[at] = out.tokens.to(dev)
        counts = out.num_valid.to(dev) if out.num_valid is not None else torch.full((len(idx),), g, device=dev)
        valid[at] = counts
        if conf is not None:
            conf[at] = out.confidence.float().to(dev)
        if lookup is not None and out.num_lookup is not None:
            lookup[at] = out.num_lookup.to(dev)
        if logits is None:
            continue
        if out.logits is not None:
            logits[at] = out.logits.to(device=dev, dtype=logits.dtype)
            continue
        rr, kk = (torch.arange(g, device=dev).unsqueeze(0) < counts.unsqueeze(1)).nonzero(as_tuple=True)
        logits[at[rr], kk, tokens[at[rr], kk]] = 0.0  # point masses
    return DraftOutput(tokens, logits, conf, num_valid=valid, num_lookup=lookup)


class Drafter(torch.nn.Module):
    method: str = ""
    #: target layers whose hidden states the loop must pass to append_context
    target_layer_ids: list[int] = []
    #: the most tokens one `draft` call can propose (block size - 1 for block drafters)
    max_draft_tokens: int = 1
    #: True: no weights, a draft costs about a lookup (prompt lookup): nothing to
    #: profile, and the engine's gates hold requests back only under load
    weightless: bool = False
    #: False: a draft whose requests are all greedy may return no logits (greedy
    #: verification reads the drafted tokens alone, and a [requests, tokens, vocabulary]
    #: tensor of -inf costs a one-request DSpark draft about 50 us); the engine turns it off,
    #: callers that read a greedy draft's q keep it on. Drafters may ignore it.
    greedy_logits: bool = True

    def reserve(self, num_slots: int, max_len: int) -> None:
        """Size the drafter's per-request memory (at most `num_slots` live requests of up
        to `max_len` tokens). Call before the first `add_request`; drafters without
        per-request memory ignore it."""

    def add_request(self, request_id: object) -> None:
        raise NotImplementedError

    def release(self, request_id: object) -> None:
        raise NotImplementedError

    def remember_reply(self, reply: list[int], namespace: str | None = None) -> None:
        """A finished request's output tokens, for drafters that learn from earlier replies
        (calibrated lookup's reply history, which keeps them in `namespace` and proposes
        them only to that namespace's requests); the others ignore it."""

    def set_namespace(self, request_id: object, namespace: str | None) -> None:
        """The namespace a request (after `add_request`) may draw on in state shared across
        requests (earlier replies); None, the default, is the shared one. Drafters without
        such state ignore it."""

    def num_requests(self) -> int:
        """Requests whose state the drafter holds now (0 when idle: anything else is a leak)."""
        raise NotImplementedError

    def append_context(
        self,
        request_ids: list[object],
        tokens: list[list[int]],  # per request, the tokens whose hidden states are given
        start_positions: list[int],  # per request, position of tokens[i][0]
        hidden: torch.Tensor,  # [sum len(tokens[i]), len(target_layer_ids), target_hidden]
    ) -> None:
        """Add accepted tokens (in order, without gaps) to each request's context."""
        raise NotImplementedError

    def rollback(self, request_id: object, length: int) -> None:
        """Forget context past `length` tokens."""
        raise NotImplementedError

    def context_length(self, request_id: object) -> int:
        raise NotImplementedError

    def record_verification(self, request_ids: list[object], lengths: list[int], accepted: list[int]) -> None:
        """The outcome of the last round per request: `lengths[i]` drafted tokens were
        verified and the first `accepted[i]` of them accepted. Drafters that learn
        online (hybrid lookup calibration) override it."""

    def draft(self, requests: list[DraftRequest], num_tokens: int) -> DraftOutput:
        """Propose `num_tokens` (1..max_draft_tokens) tokens for every request; each
        request's `anchor_position` must equal its context length."""
        raise NotImplementedError


def choose_tokens(logits: torch.Tensor, requests: list[DraftRequest]) -> torch.Tensor:
    """One drafted token per request from its logits [R, vocab], by its sampling
    params and its own generator (`dspark.sampling.sample_rows`, the one sampler)."""
    from dspark.runtime.cpu_kernels import argmax_rows
    from dspark.sampling import sample_rows

    return sample_rows(logits, [r.params for r in requests], [r.generator for r in requests], argmax_rows(logits))
