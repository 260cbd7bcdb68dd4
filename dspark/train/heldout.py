"""Teacher-forced greedy acceptance of a drafter on held-out responses.

Every anchor of every response drafts one block from the target's true context; a
block position matches when the drafter's argmax equals the target's. Two ways to
turn the matches into an acceptance length:

* per anchor (`heldout_acceptance`, what training logs): τ = 1 + Σ_k Π_{j≤k} match_j,
  every anchor weighted alike;
* as decoding meets them (`renewal_tau`): a round starts at the first response
  token, accepts its matched prefix plus the bonus token, and the next round starts
  where it ended, so τ = tokens emitted in rounds / rounds. Decoding
  lingers where the drafter fails (one token a round) and skips through what it
  predicts well, so this τ sits below the per-anchor mean whenever the two kinds of
  positions mix; it is what greedy decoding with a fixed block measures, provided
  the responses are the target's own greedy output.
"""

from __future__ import annotations

import torch

from .data import TrainSequence, visit_batches
from .losses import greedy_match
from .objectives import AnchorBatch


@torch.no_grad()
def anchor_matches(trainer, teacher, seqs: list[TrainSequence]):
    """Yields (sequence indices, batch, matches) for every visit batch of `seqs`: every
    anchor once; matches [B, A, γ] float64, 1 where the drafter's argmax at that block
    position equals the target's, 0 where it does not or lies past the sequence."""
    drafter, cfg = trainer.drafter, trainer.config
    was_training = drafter.training
    drafter.eval()
    try:
        for idx, anchors_of in visit_batches(seqs, cfg.blocks_per_seq, cfg.batch_size, cfg.seed):
            batch = AnchorBatch.build([seqs[i].tokens for i in idx], anchors_of, trainer.gamma, trainer.device)
            hidden, targets = teacher.teach(idx, batch.target_rows())
            drafted = trainer._forward(batch, hidden)
            match = greedy_match(drafted.logits, drafter.to_draft_ids(targets.ids[:, 0]))
            yield idx, batch, _full(batch, match)
    finally:
        drafter.train(was_training)


def _full(batch: AnchorBatch, match: torch.Tensor) -> torch.Tensor:
    """Matches [N] over `batch.valid` as [B, A, γ] float64, 0 where no position is."""
    full = torch.zeros(batch.valid.shape, dtype=torch.float64, device=match.device)
    full[batch.valid] = match.double()
    return full


def heldout_acceptance(trainer, teacher, seqs: list[TrainSequence]) -> dict:
    """Conditional acceptance per block position, the per-anchor τ and the renewal τ."""
    gamma = trainer.gamma
    match_n = torch.zeros(gamma, dtype=torch.float64)
    seen_n = torch.zeros(gamma, dtype=torch.float64)
    tau_sum, anchors = 0.0, 0
    accepted: list[dict[int, int]] = [{} for _ in seqs]
    for idx, batch, full in anchor_matches(trainer, teacher, seqs):
        alive = full.cumprod(-1)  # [B, A, γ]: the prefix up to k all matched
        real = batch.anchor_mask
        tau_sum += float((1 + alive.sum(-1))[real].sum())
        anchors += int(real.sum())
        prev_alive = torch.cat([torch.ones_like(alive[..., :1]), alive[..., :-1]], dim=-1)
        reached = prev_alive.bool() & batch.valid
        match_n += (full * reached).sum((0, 1)).cpu()
        seen_n += reached.double().sum((0, 1)).cpu()
        _collect(accepted, idx, batch, alive)
    cond = (match_n / seen_n.clamp(min=1)).tolist()
    rec = {f"heldout_accept@{k + 1}": round(c, 4) for k, c in enumerate(cond) if seen_n[k] > 0}
    rec["heldout_tau"] = round(tau_sum / max(anchors, 1), 4)
    tokens, rounds = map(sum, zip(*(renewal_rounds(s, a) for s, a in zip(seqs, accepted)))) if seqs else (0, 0)
    rec["heldout_renewal_tau"] = round(tokens / max(rounds, 1), 4)
    rec["heldout_anchors"] = anchors
    return rec


def _collect(out: list[dict[int, int]], idx: list[int], batch: AnchorBatch, alive: torch.Tensor) -> None:
    accepted = alive.sum(-1).long().cpu()
    anchors, real = batch.anchors.cpu(), batch.anchor_mask.cpu()
    for row, i in enumerate(idx):
        for a, n, ok in zip(anchors[row].tolist(), accepted[row].tolist(), real[row].tolist()):
            if ok:
                out[i][a] = n


def accepted_lengths(trainer, teacher, seqs: list[TrainSequence]) -> list[dict[int, int]]:
    """Per sequence: anchor position -> drafted tokens a greedy round there accepts."""
    out: list[dict[int, int]] = [{} for _ in seqs]
    for idx, batch, full in anchor_matches(trainer, teacher, seqs):
        _collect(out, idx, batch, full.cumprod(-1))
    return out


def renewal_rounds(seq: TrainSequence, accepted: dict[int, int]) -> tuple[int, int]:
    """(tokens emitted in rounds, rounds) of greedy decoding over `seq`'s response: the
    prefill emits the first response token, each round at anchor a emits accepted[a] + 1
    tokens (never past the end), and a last single token left comes from a plain step,
    as in the engine, which drafts nothing when one token remains."""
    a, last, rounds, tokens = seq.prompt_len, len(seq.tokens) - 1, 0, 0
    while a < last - 1:
        step = min(accepted.get(a, 0) + 1, last - a)
        a += step
        tokens += step
        rounds += 1
    return tokens, rounds


def renewal_tau(trainer, teacher, seqs: list[TrainSequence]) -> dict:
    """τ as greedy decoding with this block would measure it (tokens after the first
    over rounds), overall and per domain, beside the per-anchor mean."""
    lengths = accepted_lengths(trainer, teacher, seqs)
    by: dict[str, list[float]] = {}
    for seq, acc in zip(seqs, lengths):
        tokens, rounds = renewal_rounds(seq, acc)
        anchor_sum = sum(n + 1 for n in acc.values())
        for key in ("all", seq.domain or "?"):
            t = by.setdefault(key, [0.0, 0.0, 0.0, 0.0])
            t[0] += tokens
            t[1] += rounds
            t[2] += anchor_sum
            t[3] += len(acc)
    return {k: {"renewal_tau": round(t[0] / max(t[1], 1), 4), "anchor_tau": round(t[2] / max(t[3], 1), 4),
                "tokens": int(t[0]), "rounds": int(t[1])} for k, t in by.items()}


def round_start_weights(batch: AnchorBatch, match: torch.Tensor, strength: float) -> torch.Tensor:
    """[N] weights of the valid drafted positions: 1 + `strength` at the anchors where
    greedy decoding would start a round, by the drafter's own matches in this step
    (`match` [N] over `batch.valid`). The rounds of a response are decoding's cost, and
    only a round's start can shorten them: an anchor inside a span the drafter already
    predicts is never drafted from. The walk covers the anchors of the visit; where the
    next start was not sampled, it resumes at the next anchor that was."""
    accepted = _full(batch, match).cumprod(-1).sum(-1).long().cpu()
    anchors, real = batch.anchors.cpu(), batch.anchor_mask.cpu()
    start = torch.zeros(anchors.shape, dtype=torch.bool)
    for row in range(anchors.shape[0]):
        present = sorted((a, j) for j, (a, ok) in enumerate(zip(anchors[row].tolist(), real[row].tolist())) if ok)
        next_start = None
        for a, j in present:
            if next_start is None or a >= next_start:
                start[row, j] = True
                next_start = a + int(accepted[row, j]) + 1
    w = 1.0 + strength * start.to(torch.float32)
    return w.to(match.device).unsqueeze(-1).expand(batch.valid.shape)[batch.valid]
