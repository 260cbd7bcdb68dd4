"""The reduced draft vocabulary: the most frequent tokens of the training responses.

A drafter's LM head, its losses and the Markov head's output side can cover the N
most frequent response tokens instead of the whole target vocabulary (the EAGLE-3 /
vLLM / SpecForge / llama.cpp convention, stored as `draft_vocab_size` plus `d2t`).
Drafting and training get cheaper by about V/N on those parts; a token outside the
draft vocabulary can never be drafted (its draft probability is 0), which
verification handles exactly. `coverage` tells what share of held-out response
tokens a choice of N can draft at all.
"""

from __future__ import annotations

import torch

from .data import TrainSequence


def response_token_counts(seqs: list[TrainSequence], vocab_size: int) -> torch.Tensor:
    """[vocab_size] int64: how often each token occurs in the responses (the tokens a
    drafter is trained to propose; prompts are context only)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for s in seqs:
        counts += torch.bincount(torch.tensor(s.tokens[s.prompt_len:], dtype=torch.long), minlength=vocab_size)
    return counts


def most_frequent(counts: torch.Tensor, n: int, always: list[int] | None = None) -> list[int]:
    """The `n` most frequent token ids (ties broken by the lower id: BPE merges frequent
    pieces first), `always` included, sorted by id."""
    if not 1 <= n <= counts.numel():
        raise ValueError(f"draft vocabulary size must be in 1..{counts.numel()}, got {n}")
    keep = list(dict.fromkeys(int(t) for t in (always or [])))[:n]
    order = torch.argsort(-counts, stable=True).tolist()  # stable: equal counts stay in id order
    chosen = set(keep)
    for t in order:
        if len(keep) >= n:
            break
        if t not in chosen:
            keep.append(t)
            chosen.add(t)
    return sorted(keep)


def coverage(seqs: list[TrainSequence], token_ids: list[int], vocab_size: int) -> float:
    """Share of the response tokens of `seqs` that lie in `token_ids`."""
    inside = torch.zeros(vocab_size, dtype=torch.bool)
    inside[torch.tensor(token_ids, dtype=torch.long)] = True
    hit = total = 0
    for s in seqs:
        t = torch.tensor(s.tokens[s.prompt_len:], dtype=torch.long)
        hit += int(inside[t].sum())
        total += t.numel()
    return hit / max(total, 1)
