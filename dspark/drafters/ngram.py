"""n-gram prompt lookup: a drafter without weights, for any target.

It keeps each request's tokens (prompt + accepted, from `append_context`) and, at
draft time, the sequence `tokens + [anchor]`. For n from `max_ngram` down to
`min_ngram` it looks for the latest EARLIER occurrence of the sequence's last n
tokens and proposes the tokens that followed it, up to `num_tokens`; the first n
with a match wins. Proposals are deterministic: `logits` is None (a one-hot q for
the verifier) and there is no confidence.

Fewer tokens than asked (no match at all, or a match whose continuation runs into
the end of the sequence) are reported through `DraftOutput.num_valid`; the rest of
the row is -1 and must not be verified.
"""

from __future__ import annotations

import torch

from .base import DraftOutput, DraftRequest, Drafter
from .suffix_index import SuffixIndex

PAD_TOKEN = -1


def propose_continuation(seq: torch.Tensor, num_tokens: int, max_ngram: int, min_ngram: int) -> list[int]:
    """The continuation of the latest earlier occurrence of the longest matching suffix
    n-gram of `seq` [L] (int64); [] when nothing matches. A full scan: the drafter
    answers the same from its incremental `SuffixIndex`; this is the reference."""
    length = seq.numel()
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        suffix = seq[length - n :]
        windows = seq[: length - 1].unfold(0, n, 1)  # [L - n, n]: every n-gram that ends before the last token
        hits = (windows == suffix).all(dim=1).nonzero()
        if hits.numel():
            start = int(hits[-1]) + n
            return seq[start : start + num_tokens].tolist()
    return []


class NgramDrafter(Drafter):
    method = "ngram"
    weightless = True

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, max_draft_tokens: int = 7) -> None:
        super().__init__()
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        if max_draft_tokens < 1:
            raise ValueError(f"max_draft_tokens must be positive, got {max_draft_tokens}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.max_draft_tokens = max_draft_tokens
        self.target_layer_ids = []
        self._tokens: dict[object, list[int]] = {}
        #: per request, an n-gram index of its tokens and anchor (lookups without a scan)
        self._index: dict[object, SuffixIndex] = {}

    def add_request(self, request_id: object) -> None:
        if request_id in self._tokens:
            raise ValueError(f"request {request_id!r} is already registered with the drafter")
        self._tokens[request_id] = []

    def release(self, request_id: object) -> None:
        self._tokens.pop(request_id, None)
        self._index.pop(request_id, None)

    def num_requests(self) -> int:
        return len(self._tokens)

    def _seq(self, request_id: object) -> list[int]:
        try:
            return self._tokens[request_id]
        except KeyError:
            raise ValueError(f"request {request_id!r} is not registered with the drafter (add_request first)") from None

    def append_context(
        self,
        request_ids: list[object],
        tokens: list[list[int]],
        start_positions: list[int],
        hidden: torch.Tensor | None = None,  # unused: n-gram needs no hidden states
    ) -> None:
        for rid, toks, start in zip(request_ids, tokens, start_positions, strict=True):
            seq = self._seq(rid)
            if start > len(seq):
                raise ValueError(f"request {rid!r}: context starts at {start} but the drafter holds {len(seq)} tokens")
            del seq[start:]
            seq.extend(int(t) for t in toks)

    def rollback(self, request_id: object, length: int) -> None:
        seq = self._seq(request_id)
        if not 0 <= length <= len(seq):
            raise ValueError(f"cannot roll request {request_id!r} of context {len(seq)} back to {length}")
        del seq[length:]

    def context_length(self, request_id: object) -> int:
        return len(self._seq(request_id))

    def suffix_index(self, request_id: object, *parts: list[int]) -> SuffixIndex:
        """The request's n-gram index, brought up to the concatenation of `parts` (its
        emitted tokens: context, then anchor; or prompt, then output)."""
        index = self._index.get(request_id)
        if index is None:
            index = self._index[request_id] = SuffixIndex(self.max_ngram, self.min_ngram)
        index.sync(*parts)
        return index

    def draft(self, requests: list[DraftRequest], num_tokens: int) -> DraftOutput:
        if not 1 <= num_tokens <= self.max_draft_tokens:
            raise ValueError(f"ngram drafts 1..{self.max_draft_tokens} tokens per call, asked for {num_tokens}")
        out = torch.full((len(requests), num_tokens), PAD_TOKEN, dtype=torch.long)
        valid = torch.zeros(len(requests), dtype=torch.long)
        for i, req in enumerate(requests):
            seq = self._seq(req.request_id)
            if req.anchor_position != len(seq):
                raise ValueError(
                    f"request {req.request_id!r}: anchor at position {req.anchor_position} but the drafter "
                    f"holds {len(seq)} context tokens"
                )
            cont = self.suffix_index(req.request_id, seq, [req.anchor_token]).latest(num_tokens)
            out[i, : len(cont)] = torch.tensor(cont, dtype=torch.long)
            valid[i] = len(cont)
        return DraftOutput(out, None, None, valid)
