"""The anchors where prompt lookup cannot supply the next token.

The default configuration drafts with prompt lookup and a DSpark block under one
scheduler (`dspark.drafters.hybrid`): where the request's own text holds a match for
its last tokens, lookup proposes the continuation and usually wins; where it holds
none, or the match continues wrongly, only the learned drafter can shorten decoding.
`--lookup-miss-weight W` weighs those anchors 1 + W in training.

`lookup_first_tokens` gives, for every position of a sequence, the first token
`dspark.drafters.lookup.lookup` proposes from the tokens up to it, in one pass:
per n-gram length, a table of the continuations seen so far (count and latest
position), so the longest matched suffix's most frequent continuation, ties to the
latest, is a dictionary lookup instead of a scan.
"""

from __future__ import annotations

import torch

from .objectives import AnchorBatch


def lookup_first_tokens(tokens: list[int], max_ngram: int = 3, min_ngram: int = 1) -> list[int | None]:
    """[len(tokens)] the token lookup proposes after tokens[: i + 1] (None: no match)."""
    tables: dict[int, dict[tuple, dict[int, tuple[int, int]]]] = {n: {} for n in range(min_ngram, max_ngram + 1)}
    out: list[int | None] = []
    for i, tok in enumerate(tokens):
        for n, table in tables.items():  # the n-grams that end just before i continue with tokens[i]
            if i >= n:
                cell = table.setdefault(tuple(tokens[i - n:i]), {})
                seen = cell.get(tok)
                cell[tok] = ((seen[0] if seen else 0) + 1, i)
        proposal = None
        for n in range(min(max_ngram, i), min_ngram - 1, -1):
            cell = tables[n].get(tuple(tokens[i - n + 1:i + 1]))
            if cell:
                proposal = max(cell.items(), key=lambda kv: kv[1])[0]
                break
        out.append(proposal)
    return out


def lookup_misses(tokens: list[int], max_ngram: int = 3, min_ngram: int = 1) -> torch.Tensor:
    """[len(tokens)] bool: True at position i where lookup's proposal after tokens[: i + 1]
    is not tokens[i + 1] (no match, or a wrong one); False at the last position."""
    first = lookup_first_tokens(tokens, max_ngram, min_ngram)
    miss = [first[i] != tokens[i + 1] for i in range(len(tokens) - 1)] + [False]
    return torch.tensor(miss, dtype=torch.bool)


def lookup_miss_weights(batch: AnchorBatch, misses: list[torch.Tensor], strength: float) -> torch.Tensor:
    """[N] weights of the valid drafted positions: 1 + `strength` for every position of a
    block whose anchor is a lookup miss (`misses[b]` of sequence b of the batch)."""
    anchors = batch.anchors.cpu()
    hit = torch.stack([m[a] for m, a in zip(misses, anchors)])  # [B, A]
    w = 1.0 + strength * hit.to(torch.float32)
    return w.to(batch.valid.device).unsqueeze(-1).expand(batch.valid.shape)[batch.valid]
