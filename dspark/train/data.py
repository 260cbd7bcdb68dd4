"""Training sequences from regenerated-response files, anchor sampling and the batch
plan shared by every method.

A sequence is `prompt_token_ids + response_token_ids` (+ the end-of-turn token when
the reply stopped by itself, so drafters learn to propose it). Anchors are sampled
in the response: anchor position a (a token the target has emitted) drafts tokens
a+1..a+γ from the target context 0..a-1, exactly as in decoding, where the anchor is
the last emitted token and its own target hidden state is not known yet.

Everything random here is a pure function of (seed, epoch, sequence index), never of
the rank, so a global batch is the same whether one process or many compute it, and
a resumed run takes the same batches as an uninterrupted one.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch

from dspark.data.records import read_records
from dspark.errors import UserError


@dataclass(frozen=True)
class TrainSequence:
    id: str
    domain: str
    tokens: list[int]
    prompt_len: int

    @property
    def num_anchor_positions(self) -> int:
        """Anchors a in [prompt_len, len - 2]: each has at least one label."""
        return max(0, len(self.tokens) - 1 - self.prompt_len)


def end_of_turn_id(tokenizer) -> int | None:
    """The token a stopped reply ends with (used when a record does not name it)."""
    if tokenizer is None:
        return None
    tid = getattr(getattr(tokenizer, "tok", None), "eos_token_id", None)
    if tid is None and tokenizer.eos_token_ids:
        tid = tokenizer.eos_token_ids[0]
    return tid


def load_sequences(paths: list[str | Path], eos_token_id: int | None, max_len: int) -> list[TrainSequence]:
    """Records of every file, in file order; sequences are cut at `max_len` tokens and
    those without a response token to predict are dropped."""
    out: list[TrainSequence] = []
    for path in paths:
        p = Path(path)
        if not p.is_file():
            raise UserError(f"training data {str(p)!r} not found; create it with `dspark data generate --out {p}`")
        for rec in read_records(p):
            try:
                prompt = list(rec["prompt_token_ids"])
                response = list(rec["response_token_ids"])
            except KeyError as e:
                raise UserError(f"{p}: record {rec.get('id')!r} lacks {e.args[0]!r}; is this a `dspark data generate` file?") from None
            if rec.get("finish_reason") == "stop":
                stop = rec.get("stop_token_id")
                stop = eos_token_id if stop is None else stop
                if stop is not None:
                    response.append(int(stop))
            tokens = (prompt + response)[:max_len]
            seq = TrainSequence(str(rec.get("id", f"{p.name}/{len(out)}")), str(rec.get("domain", "")), tokens, len(prompt))
            if seq.num_anchor_positions > 0:
                out.append(seq)
    if not out:
        raise UserError(f"no usable training sequences in {', '.join(map(str, paths))} (every response is empty "
                        f"or its prompt is longer than --max-seq-len {max_len})")
    return out


def sequences_digest(seqs: list[TrainSequence]) -> str:
    h = hashlib.sha256()
    for s in seqs:
        h.update(f"{s.prompt_len}:{','.join(map(str, s.tokens))};".encode())
    return h.hexdigest()[:16]


def _generator(seed: int, *keys: int) -> torch.Generator:
    digest = hashlib.sha256("/".join(map(str, (seed, *keys))).encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)


def visit_anchors(seq: TrainSequence, per_visit: int, seed: int, epoch: int, index: int, visit: int) -> list[int]:
    """The anchor positions of `seq` trained at its `visit`-th visit of `epoch`, sorted.

    Dense supervision: every anchor position of the sequence (every response token with
    a label) is shuffled once per epoch and cut into visits of at most `per_visit`
    anchors, so one epoch trains every response position as an anchor exactly once."""
    n = seq.num_anchor_positions
    pick = torch.randperm(n, generator=_generator(seed, epoch, index))[visit * per_visit : (visit + 1) * per_visit]
    return sorted(seq.prompt_len + int(i) for i in pick)


def visits_per_sequence(seqs: list[TrainSequence], per_visit: int) -> list[int]:
    return [max(1, -(-s.num_anchor_positions // per_visit)) for s in seqs]


def visit_batches(seqs: list[TrainSequence], per_visit: int, batch_size: int, seed: int,
                  epoch: int = 0) -> list[tuple[list[int], list[list[int]]]]:
    """Every visit of every sequence in order, `batch_size` visits at a time, as
    (sequence indices, anchors of each visit): one pass over every anchor, for
    held-out evaluation and calibration."""
    items = [(i, v) for i, n in enumerate(visits_per_sequence(seqs, per_visit)) for v in range(n)]
    return [([i for i, _ in chunk], [visit_anchors(seqs[i], per_visit, seed, epoch, i, v) for i, v in chunk])
            for chunk in (items[s : s + batch_size] for s in range(0, len(items), batch_size))]


def epoch_order(num_items: int, seed: int, epoch: int) -> list[int]:
    return torch.randperm(num_items, generator=_generator(seed, epoch, -1)).tolist()


@dataclass
class BatchPlan:
    """Global batches of `batch_size` sequence visits per step; rank r of w takes every
    w-th. An epoch is every visit of every sequence (`visits[i]` for sequence i), in
    an order that is a pure function of (seed, epoch): resuming at step s continues
    with exactly the batches an uninterrupted run would have taken."""

    visits: list[int]
    batch_size: int
    seed: int
    rank: int = 0
    world_size: int = 1

    def __post_init__(self) -> None:
        if self.batch_size % self.world_size:
            raise UserError(f"--batch-size {self.batch_size} must be a multiple of the {self.world_size} processes")
        self._items = [(i, v) for i, n in enumerate(self.visits) for v in range(n)]
        if len(self._items) < self.batch_size:
            raise UserError(f"{len(self._items)} sequence visits are fewer than --batch-size {self.batch_size}")

    @property
    def num_items(self) -> int:
        return len(self._items)

    @property
    def steps_per_epoch(self) -> int:
        return self.num_items // self.batch_size  # the incomplete last batch is dropped

    def local_batch(self, step: int) -> tuple[int, list[tuple[int, int]]]:
        """(epoch, this rank's (sequence index, visit) pairs) of global step `step` (from 0)."""
        epoch, i = divmod(step, self.steps_per_epoch)
        order = epoch_order(self.num_items, self.seed, epoch)
        batch = [self._items[j] for j in order[i * self.batch_size : (i + 1) * self.batch_size]]
        return epoch, batch[self.rank :: self.world_size]
