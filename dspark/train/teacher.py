"""What the frozen target teaches: its tapped hidden states (the drafter's input
features) and its next-token distributions p (the distillation targets).

Both come from our runtime (`Transformer.forward`), the code that serves the target,
so training sees exactly the features decoding will feed the drafter.

Why distributions are always recomputed, and hidden states optionally cached:
a full-vocabulary distribution is 49,152 floats per token for SmolLM2 (~200 KB in
fp32, ~25 GB for 120k training tokens), so p is never stored. A token's hidden state
is one vector per tapped layer (576 values each), ~7 KB in bf16 for six layers, so
a data set's hidden states fit on disk. `CachedTeacher` runs the target once per
data set and stores the tapped layers plus the LAST layer's output in safetensors;
p is then recomputed exactly from the last layer through the target's own final
norm and LM head, at the sampled positions only. On a CPU the target forward costs
about as much as a drafter step, so the cache pays from the second epoch on and is
shared by every method (its default layer set covers all four methods' taps).
`OnTheFlyTeacher` runs the target every step instead (no disk, any data size).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from dspark.runtime.batch import FlatBatch
from dspark.runtime.kv_cache import KVCachePool
from dspark.runtime.model import Transformer

from .data import TrainSequence, sequences_digest


def pad_hidden(parts: list[torch.Tensor], seq_len: int) -> torch.Tensor:
    """Per-sequence [L_b, taps, H] -> zero-padded [B, seq_len, taps, H]."""
    out = parts[0].new_zeros(len(parts), seq_len, *parts[0].shape[1:])
    for b, h in enumerate(parts):
        out[b, : h.shape[0]] = h
    return out


class OnTheFlyTeacher:
    """Runs the target over each training batch."""

    def __init__(self, model: Transformer, layers: list[int], seqs: list[TrainSequence] | None = None) -> None:
        self.model = model
        self.layers = list(layers)
        self.seqs = seqs or []
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

    def teach(self, indices: list[int], rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """For sequences `indices`: (hidden [B, S, taps, H] zero-padded, target logits
        [sum len(rows[b]), vocab] fp32); the logits at row r predict token r + 1."""
        seqs = [self.seqs[i] for i in indices]
        parts, logits = self.run([s.tokens for s in seqs], self.layers, rows)
        return pad_hidden(parts, max(len(s.tokens) for s in seqs)), logits


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
    """Hidden states from a safetensors cache (built on first use); p recomputed from
    the cached last layer with the target's final norm and LM head."""

    def __init__(self, model: Transformer, layers: list[int], seqs: list[TrainSequence], cache_dir: str | Path,
                 model_name: str, build_batch_tokens: int = 4096, progress: bool = True,
                 build: bool = True) -> None:
        self.model = model
        self.layers = list(layers)
        self.last = model.cfg.num_layers - 1
        self.path = find_cache(cache_dir, seqs, model, model_name, self.layers + [self.last])
        if self.path is None:
            if not build:
                raise FileNotFoundError("feature cache not built yet")
            self.path = build_cache(model, seqs, cache_dir, model_name, cache_layers(model, self.layers),
                                    build_batch_tokens, progress)
        self._file = safe_open(str(self.path), framework="pt")
        stored = json.loads(self._file.metadata()["layers"])
        self._tap_index = [stored.index(i) for i in self.layers]
        self._last_index = stored.index(self.last)
        self.seqs = seqs

    @torch.no_grad()
    def teach(self, indices: list[int], rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        seqs = [self.seqs[i] for i in indices]
        stored = [self._file.get_tensor(f"s{i}").to(self.model.device) for i in indices]  # [L, stored, H]
        taps = [h[:, self._tap_index] for h in stored]
        last = torch.cat([h[r, self._last_index] for h, r in zip(stored, rows)])  # [N, H]
        # The runtime computes logits exactly so: final norm + LM head on the selected rows.
        logits = self.model.logits(last.to(self.model.dtype)).float()
        return pad_hidden(taps, max(len(s.tokens) for s in seqs)), logits


def _cache_key(seqs: list[TrainSequence], model: Transformer, model_name: str) -> str:
    meta = f"{sequences_digest(seqs)}|{model_name}|{model.cfg.num_layers}|{model.cfg.hidden_size}|{model.dtype}"
    return hashlib.sha256(meta.encode()).hexdigest()[:16]


def find_cache(cache_dir: str | Path, seqs: list[TrainSequence], model: Transformer, model_name: str,
               needed: list[int]) -> Path | None:
    """A cache file for these sequences and this target holding every `needed` layer."""
    key = _cache_key(seqs, model, model_name)
    for path in sorted(Path(cache_dir).glob(f"features-{key}-*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            if set(needed) <= set(json.loads(f.metadata()["layers"])):
                return path
    return None


def build_cache(model: Transformer, seqs: list[TrainSequence], cache_dir: str | Path, model_name: str,
                layers: list[int], batch_tokens: int = 4096, progress: bool = True) -> Path:
    from tqdm import tqdm

    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    key = _cache_key(seqs, model, model_name)
    path = cache_dir / f"features-{key}-{'_'.join(map(str, layers))}.safetensors"
    runner = OnTheFlyTeacher(model, layers)
    tensors: dict[str, torch.Tensor] = {}
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i].tokens))  # similar lengths batch well
    bar = tqdm(total=sum(len(s.tokens) for s in seqs), unit="tok", desc="feature cache", disable=not progress,
               dynamic_ncols=True)
    i = 0
    while i < len(order):
        group = [order[i]]
        while i + len(group) < len(order) and (len(group) + 1) * len(seqs[order[i + len(group)]].tokens) <= batch_tokens:
            group.append(order[i + len(group)])
        parts, _ = runner.run([seqs[j].tokens for j in group], layers, None)
        for j, h in zip(group, parts):
            tensors[f"s{j}"] = h.cpu().contiguous()
            bar.update(h.shape[0])
        i += len(group)
    bar.close()
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata={"layers": json.dumps(layers), "model": model_name,
                                           "num_sequences": str(len(seqs))})
    tmp.replace(path)
    return path
