"""The feature cache on disk: the target's tapped hidden states and its top-k p for
every training sequence, in safetensors shards that are written as the build goes.

Layout, for one data set and target (`key`), one set of stored layers and one k:

    features-{key}-{layers}-top{k}.part0000.safetensors   sequences the first shard holds
    features-{key}-{layers}-top{k}.part0001.safetensors   ...
    features-{key}-{layers}-top{k}.json                   the manifest: written last

A shard holds whole sequences (`s{i}`, `ids{i}`, `probs{i}`) and names them in its
metadata. Shards are renamed into place only when complete, so an interrupted build
resumes where its last shard ended (a shard is about `shard_bytes`, 512 MB by default:
a few minutes of target time) and never holds the whole cache in memory; the manifest
marks the cache complete. A single-file cache (`features-...-top{k}.safetensors`, the
earlier layout) is still read.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from dspark.runtime.model import Transformer

from .data import TrainSequence, sequences_digest

SHARD_BYTES = 512 * 2**20


def cache_key(seqs: list[TrainSequence], model: Transformer, model_name: str) -> str:
    meta = f"{sequences_digest(seqs)}|{model_name}|{model.cfg.num_layers}|{model.cfg.hidden_size}|{model.dtype}"
    return hashlib.sha256(meta.encode()).hexdigest()[:16]


def _stem(key: str, layers: list[int], topk: int) -> str:
    return f"features-{key}-{'_'.join(map(str, layers))}-top{topk}"


class FeatureStore:
    """Read access to a complete cache: a manifest of shards or one single file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._where: dict[int, object] = {}
        if self.path.suffix == ".json":
            meta = json.loads(self.path.read_text())
            self.layers = list(meta["layers"])
            self._files = [safe_open(str(self.path.parent / name), framework="pt") for name in meta["parts"]]
            for f in self._files:
                for i in json.loads(f.metadata()["sequences"]):
                    self._where[int(i)] = f
        else:
            f = safe_open(str(self.path), framework="pt")
            self.layers = json.loads(f.metadata()["layers"])
            self._files = [f]
            self._single = f

    def _file(self, i: int):
        f = self._where.get(i) if self._where else self._single
        if f is None:
            raise KeyError(f"sequence {i} is not in the feature cache {self.path}")
        return f

    def hidden(self, i: int) -> torch.Tensor:
        """[L, stored layers, H] of sequence i."""
        return self._file(i).get_tensor(f"s{i}")

    def topk(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids int32, probs fp16), [response rows, k] of sequence i."""
        f = self._file(i)
        return f.get_slice(f"ids{i}")[:], f.get_slice(f"probs{i}")[:]


def _describes(meta: dict, needed: list[int], topk: int) -> bool:
    return set(needed) <= set(meta["layers"]) and int(meta.get("topk", -1)) == topk


def find_cache(cache_dir: str | Path, seqs: list[TrainSequence], model: Transformer, model_name: str,
               needed: list[int], topk: int) -> Path | None:
    """A complete cache for these sequences and this target holding every `needed` layer
    and the top-`topk` of p: a manifest, or a single file of the earlier layout."""
    key = cache_key(seqs, model, model_name)
    for path in sorted(Path(cache_dir).glob(f"features-{key}-*.json")):
        if _describes(json.loads(path.read_text()), needed, topk):
            return path
    for path in sorted(Path(cache_dir).glob(f"features-{key}-*.safetensors")):
        if ".part" in path.name:
            continue
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata()
            if _describes({"layers": json.loads(meta["layers"]), "topk": meta.get("topk", -1)}, needed, topk):
                return path
    return None


def build_cache(seqs: list[TrainSequence], cache_dir: str | Path, key: str, model_name: str, layers: list[int],
                topk: int, run: Callable[[list[int]], list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]],
                batch_tokens: int = 2048, progress: bool = True, shard_bytes: int | None = None) -> Path:
    """Build (or finish) the cache: `run(group)` gives, for each sequence index of the
    group, (hidden [L, layers, H], top-k ids, top-k probs). Returns the manifest."""
    from tqdm import tqdm

    shard_bytes = SHARD_BYTES if shard_bytes is None else shard_bytes
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    stem = _stem(key, layers, topk)
    parts = sorted(p.name for p in cache_dir.glob(f"{stem}.part*.safetensors"))
    done: set[int] = set()
    for name in parts:
        with safe_open(str(cache_dir / name), framework="pt") as f:
            done.update(int(i) for i in json.loads(f.metadata()["sequences"]))
    order = [i for i in sorted(range(len(seqs)), key=lambda i: len(seqs[i].tokens)) if i not in done]
    total = sum(len(s.tokens) for s in seqs)
    bar = tqdm(total=total, initial=sum(len(seqs[i].tokens) for i in done), unit="tok", desc="feature cache",
               disable=not progress, dynamic_ncols=True)
    shard: dict[str, torch.Tensor] = {}
    held: list[int] = []

    def flush() -> None:
        name = f"{stem}.part{len(parts):04d}.safetensors"
        tmp = cache_dir / (name + ".tmp")
        save_file(shard, str(tmp), metadata={"layers": json.dumps(layers), "model": model_name, "topk": str(topk),
                                             "sequences": json.dumps(held)})
        tmp.replace(cache_dir / name)
        parts.append(name)
        shard.clear()
        held.clear()

    at = 0
    while at < len(order):
        group = [order[at]]
        while (at + len(group) < len(order)
               and (len(group) + 1) * len(seqs[order[at + len(group)]].tokens) <= batch_tokens):
            group.append(order[at + len(group)])
        for j, (h, ids, probs) in zip(group, run(group)):
            shard[f"s{j}"], shard[f"ids{j}"], shard[f"probs{j}"] = h, ids, probs
            held.append(j)
            bar.update(len(seqs[j].tokens))
        at += len(group)
        if sum(t.numel() * t.element_size() for t in shard.values()) >= shard_bytes:
            flush()
    if shard:
        flush()
    bar.close()
    manifest = cache_dir / f"{stem}.json"
    manifest.write_text(json.dumps({"layers": layers, "topk": topk, "model": model_name,
                                    "num_sequences": len(seqs), "parts": parts}, indent=1))
    return manifest
