"""The left-to-right part of a DSpark draft, for a vanilla Markov head over restricted
candidates, with its per-position work precomputed in a few batched operations.

With a vanilla head the bias at position k depends only on the token drafted at k-1:
z_k = W1[token_{k-1}], logits_k = base_k + W2 z_k. Drafting restricts position k to
its C candidates (the top C of base_k), and the token at k-1 is one of the C
candidates of position k-1, unless it is external: the anchor (k = 0) or a lookup
token (hybrid drafting, inside the lookup prefix and right after it). So every
logits row a draft can need is known before anything is drawn:

    table[r, k-1, i, :] = base_cand[r, k] + W2_cand[r, k] . W1[cand[r, k-1, i]]   (prev a candidate)
    ext[r, k, :]        = base_cand[r, k] + W2_cand[r, k] . W1[external prev at k]

one batched matmul each, where a loop over positions pays a dozen small tensor
operations per drafted token. Greedy requests then follow their argmax through the
table in plain Python; sampled ones draw position by position from the selected rows
(`choose_tokens`, one draw per request and position, as before). Every token comes
with the exact row it was chosen from, which the verifier uses as its q, so drafting
stays lossless.
"""

from __future__ import annotations

import torch

from dspark.runtime.cpu_kernels import argmax_rows

from .base import DraftRequest, choose_tokens


def walk_vanilla(
    base_cand: torch.Tensor,  # [R, n, C] fp32 backbone logits of the candidates
    cand_target: torch.Tensor,  # [R, n, C] their target ids
    w2c: torch.Tensor,  # [R, n, C, rank] their W2 rows, in W1's dtype
    w1: torch.Tensor,  # [target vocab, rank] W1
    anchors: torch.Tensor,  # [R] target ids
    requests: list[DraftRequest],
    look_tok: torch.Tensor | None = None,  # [R, n] lookup tokens (hybrid), or None
    used: torch.Tensor | None = None,  # [R, n] bool: a prefix of each row takes the lookup token
) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [R, n] target ids, logits [R, n, C]: the row each drafter token was
    chosen from; at lookup positions the row for the lookup prefix, which the caller
    replaces by a point mass)."""
    r, n, c = base_cand.shape
    # external previous tokens: the anchor, then (with lookup) the lookup token before k
    if used is not None and bool(used.any()):
        ext_prev = torch.cat([anchors.unsqueeze(1), look_tok[:, :-1]], dim=1)  # [R, n]
        starts = used.sum(1).tolist()  # first drafter position per request
    else:
        ext_prev = anchors.unsqueeze(1)  # [R, 1]
        starts = [0] * r
    e = ext_prev.shape[1]
    ext = base_cand[:, :e] + torch.matmul(w2c[:, :e], w1[ext_prev].unsqueeze(-1)).squeeze(-1).float()  # [R, e, C]
    rows = ext.reshape(r * e, c)
    if n > 1:
        z = w1[cand_target[:, :-1]]  # [R, n-1, C, rank]
        table = base_cand[:, 1:].unsqueeze(2) + torch.matmul(z, w2c[:, 1:].transpose(-1, -2)).float()  # [R, n-1, C, C]
        rows = torch.cat([rows, table.reshape(-1, c)])
    # row of `rows` for request i at position k: external prev -> i*e + k;
    # prev = candidate j of position k-1 -> r*e + ((i*(n-1) + k-1) * c + j)

    def ext_row(i: int, k: int) -> int:
        return i * e + min(k, e - 1)

    def table_row(i: int, k: int, j: int) -> int:
        return r * e + (i * (n - 1) + k - 1) * c + j

    picks = [[0] * n for _ in range(r)]  # candidate index chosen per request and position
    index = [[0] * n for _ in range(r)]  # row of `rows` it was chosen from
    if all(req.params.greedy for req in requests):
        best = argmax_rows(rows).tolist()
        for i in range(r):
            m = min(starts[i], n)
            for k in range(n):
                idx = ext_row(i, k) if k <= m else table_row(i, k, picks[i][k - 1])
                index[i][k] = idx
                picks[i][k] = best[idx] if k >= m else 0
    else:
        for k in range(n):
            for i in range(r):
                index[i][k] = ext_row(i, k) if k <= starts[i] else table_row(i, k, picks[i][k - 1])
            chosen = choose_tokens(rows[[index[i][k] for i in range(r)]], requests).tolist()
            for i in range(r):
                picks[i][k] = chosen[i]
    logits = rows[torch.tensor(index, dtype=torch.long, device=rows.device)]  # [R, n, C]
    tokens = cand_target.gather(2, torch.tensor(picks, dtype=torch.long, device=rows.device).unsqueeze(-1)).squeeze(-1)
    if used is not None:
        tokens = torch.where(used, look_tok, tokens)
    return tokens, logits
