"""What the frozen target teaches: its tapped hidden states (the drafter's input
features) and its next-token distributions p (the distillation targets).

Both come from our runtime (`Transformer.forward`), the code that serves the target,
so training sees exactly the features decoding will feed the drafter.

p is kept as its top-k (`TopKTargets`: the k most probable target ids and their
probabilities, k = 32 by default; the rest of the mass is the `tail`). A full
distribution is 49,152 floats per token for SmolLM2, and recomputing it every step
from the cached last layer cost more than the drafter step itself; the top-k is 32
ids and probabilities, computed once. The loss (`losses.position_terms`) bounds what
the truncation can hide: the total-variation distance it computes differs from the
exact one by at most the tail mass, reported by `dspark train` as `teacher_tail`.

`CachedTeacher` runs the target once per data set and stores in safetensors the
tapped layers every method uses (so one cache serves all four) and the top-k of p at
every response row. `OnTheFlyTeacher` runs the target every step instead (no disk,
any data size) and gives the same top-k.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from dspark.runtime.batch import FlatBatch
from dspark.runtime.kv_cache import KVCachePool
from dspark.runtime.model import Transformer

from .data import TrainSequence
from .feature_store import FeatureStore, build_cache, cache_key, find_cache

DEFAULT_TOPK = 32


@dataclass
class TopKTargets:
    """The target's next-token distributions at N rows, truncated to their top k."""

    ids: torch.Tensor  # [N, k] int64 target ids, most probable first
    probs: torch.Tensor  # [N, k] fp32

    @property
    def tail(self) -> torch.Tensor:
        """[N] probability mass outside the top k."""
        return (1 - self.probs.sum(-1)).clamp(min=0)

    @classmethod
    def of_logits(cls, logits: torch.Tensor, k: int) -> "TopKTargets":
        probs = torch.softmax(logits.float(), dim=-1)
        top = probs.topk(min(k, probs.shape[-1]), dim=-1)
        return cls(top.indices, top.values)

    @classmethod
    def cat(cls, parts: list["TopKTargets"]) -> "TopKTargets":
        return cls(torch.cat([p.ids for p in parts]), torch.cat([p.probs for p in parts]))


def pad_hidden(parts: list[torch.Tensor], seq_len: int) -> torch.Tensor:
    """Per-sequence [L_b, taps, H] -> zero-padded [B, seq_len, taps, H]."""
    out = parts[0].new_zeros(len(parts), seq_len, *parts[0].shape[1:])
    for b, h in enumerate(parts):
        out[b, : h.shape[0]] = h
    return out


class OnTheFlyTeacher:
    """Runs the target over each training batch."""

    def __init__(self, model: Transformer, layers: list[int], seqs: list[TrainSequence] | None = None,
                 topk: int = DEFAULT_TOPK) -> None:
        self.model = model
        self.layers = list(layers)
        self.seqs = seqs or []
        self.topk = topk
        self._cache: KVCachePool | None = None

    def _pool(self, num: int, max_len: int) -> KVCachePool:
        c = self._cache
        if c is None or c.num_slots < num or c.max_len < max_len:
            c = self._cache = KVCachePool(self.model.cfg, num, max_len, self.model.dtype, self.model.device)
        c.lengths = [0] * c.num_slots
        return c

    @torch.no_grad()
    def run(
        self, seqs: list[list[int]], layers: list[int], rows: list[list[int]] | None
    ) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        """Per sequence its hidden states [L_b, len(layers), H], and the target logits
        [sum len(rows[b]), vocab] (fp32) of the given positions (None: no logits)."""
        pool = self._pool(len(seqs), max(len(s) for s in seqs))
        batch = FlatBatch.from_requests(seqs, [0] * len(seqs), list(range(len(seqs))), logits="none",
                                        device=self.model.device)
        if rows is not None:
            starts = batch.cu_seqlens[:-1]
            batch.logit_rows = torch.tensor([st + r for st, rs in zip(starts, rows) for r in rs],
                                            dtype=torch.long, device=self.model.device)
        logits, hidden = self.model(batch, pool, hidden_layers=layers)
        # Outside inference mode from here on: the drafter's graph will use these.
        hidden = hidden.clone()
        parts = [hidden[a:b] for a, b in zip(batch.cu_seqlens, batch.cu_seqlens[1:])]
        return parts, (logits.clone() if rows is not None else None)

    def teach(self, indices: list[int], rows: list[list[int]]) -> tuple[torch.Tensor, TopKTargets]:
        """For sequences `indices`: (hidden [B, S, taps, H] zero-padded, the top-k of p at
        the rows, flattened in order); p at row r predicts token r + 1."""
        seqs = [self.seqs[i] for i in indices]
        parts, logits = self.run([s.tokens for s in seqs], self.layers, rows)
        return pad_hidden(parts, max(len(s.tokens) for s in seqs)), TopKTargets.of_logits(logits, self.topk)


def cache_layers(model: Transformer, wanted: list[int]) -> list[int]:
    """The layers a feature cache stores: `wanted`, every method's default taps for this
    target (so one cache serves all four methods) and the last layer (for p)."""
    from dspark.drafters.config import DEFAULT_NUM_TAPS, spread_layer_ids

    n = model.cfg.num_layers
    layers = set(wanted) | {n - 1}
    for count in DEFAULT_NUM_TAPS.values():
        layers.update(spread_layer_ids(n, min(count, n)))
    return sorted(layers)


class CachedTeacher:
    """Hidden states and the top-k of p from a feature cache on disk (`feature_store`),
    built on first use and resumed if a build was interrupted."""

    def __init__(self, model: Transformer, layers: list[int], seqs: list[TrainSequence], cache_dir: str | Path,
                 model_name: str, build_batch_tokens: int = 2048, progress: bool = True,
                 build: bool = True, topk: int = DEFAULT_TOPK) -> None:
        self.model = model
        self.layers = list(layers)
        self.topk = topk
        self.path = find_cache(cache_dir, seqs, model, model_name, self.layers, topk)
        if self.path is None:
            if not build:
                raise FileNotFoundError("feature cache not built yet")
            stored = cache_layers(model, self.layers)
            runner = OnTheFlyTeacher(model, stored)

            def run(group: list[int]):
                rows = [list(range(seqs[j].prompt_len, len(seqs[j].tokens) - 1)) for j in group]
                hidden, logits = runner.run([seqs[j].tokens for j in group], stored, rows)
                out, at = [], 0
                for h, r in zip(hidden, rows):
                    top = TopKTargets.of_logits(logits[at : at + len(r)], topk)
                    at += len(r)
                    out.append((h.cpu().contiguous(), top.ids.to(torch.int32).cpu().contiguous(),
                                top.probs.to(torch.float16).cpu().contiguous()))
                return out

            self.path = build_cache(seqs, cache_dir, cache_key(seqs, model, model_name), model_name, stored, topk,
                                    run, build_batch_tokens, progress)
        self._store = FeatureStore(self.path)
        self._tap_index = [self._store.layers.index(i) for i in self.layers]
        self.seqs = seqs

    @torch.no_grad()
    def teach(self, indices: list[int], rows: list[list[int]]) -> tuple[torch.Tensor, TopKTargets]:
        seqs = [self.seqs[i] for i in indices]
        dev = self.model.device
        taps = [self._store.hidden(i)[:, self._tap_index].to(dev) for i in indices]  # [L, taps, H]
        parts = []
        for i, seq, r in zip(indices, seqs, rows):
            local = torch.tensor(r, dtype=torch.long) - seq.prompt_len
            if len(r) and (int(local.min()) < 0 or int(local.max()) >= len(seq.tokens) - 1 - seq.prompt_len):
                raise ValueError(f"rows {r} of sequence {i} lie outside its cached response rows")
            ids, probs = self._store.topk(i)
            parts.append(TopKTargets(ids.index_select(0, local).long().to(dev),
                                     probs.index_select(0, local).float().to(dev)))
        return pad_hidden(taps, max(len(s.tokens) for s in seqs)), TopKTargets.cat(parts)
