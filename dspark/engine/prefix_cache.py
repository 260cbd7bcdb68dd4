"""Prompt prefixes computed once: the keys and values of recent prompts, reused by later
prompts that begin the same way.

Chat prompts share a long head: the chat template and its system prompt (24 of the 41
tokens of a one-line question to the default model). Every prompt's keys and values
are copied out when its prefill completes; a new prompt takes the longest common prefix
with any kept prompt (up to its last token, whose logits it needs) into its KV slot and
prefills only the rest, as a chunked prefill that starts there.

Exact by the same argument as chunked prefill: a position's keys and values depend only
on the tokens up to it, and in a batch-invariant precision (the engine enables the cache
only in those) they come out bit for bit the same whatever shared the step that computed
them. With a drafter, the target's tapped hidden states of the prompt are kept too (the
drafter's context is built from them); a kept prompt without them (prefilled in
several chunks) serves only requests that will not draft.

Entries are whole prompts (at most `max_tokens` each), the least recently used dropped
beyond `max_bytes` in all.

Every entry belongs to a namespace (the serving layer's hash of a tenant and its
`cache_salt`; None for the one shared namespace of a single-tenant server): a prompt
reuses only what its own namespace kept, since a reuse starts the prompt sooner and
that time would tell one tenant what another asked. The byte budget and its LRU order
stay global, so no namespace can hold more than the cache or push others' entries out
sooner than the same traffic would in one namespace.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from dspark.runtime.kv_cache import KVCachePool


#: a namespace as the serving layer names it (None: the shared one)
Namespace = str | None


@dataclass
class _Entry:
    key: tuple[Namespace, tuple[int, ...]]  # its namespace and the prompt's tokens
    tokens: torch.Tensor  # [n] long, the same, for matching
    k: list[torch.Tensor]  # per layer [kv heads, n, head dim]
    v: list[torch.Tensor]
    taps: torch.Tensor | None  # [n, taps, hidden] or None
    nbytes: int


class PrefixCache:
    def __init__(self, cache: KVCachePool, max_bytes: int = 64 << 20, max_tokens: int = 1024,
                 min_tokens: int = 8) -> None:
        self.cache = cache
        self.max_bytes = max_bytes
        self.max_tokens = max_tokens
        self.min_tokens = min_tokens
        self._entries: OrderedDict[tuple[Namespace, tuple[int, ...]], _Entry] = OrderedDict()  # all, LRU first
        #: the same entries by namespace: a match walks its own namespace's alone
        self._spaces: dict[Namespace, dict[tuple[Namespace, tuple[int, ...]], _Entry]] = {}
        self.bytes = 0
        #: prompts that reused a prefix, prompt tokens not computed thanks to it, lookups,
        #: prompt tokens looked up
        self.hits = 0
        self.tokens_saved = 0
        self.lookups = 0
        self.tokens_queried = 0

    def __len__(self) -> int:
        return len(self._entries)

    def match(self, prompt_ids: list[int], need_taps: bool,
              namespace: Namespace = None) -> tuple[_Entry | None, int]:
        """The kept prompt of `namespace` sharing the longest prefix with `prompt_ids`, and
        that length (at most len(prompt_ids) - 1; 0 when none reaches `min_tokens`).
        `need_taps`: only entries that kept the drafter's taps."""
        self.lookups += 1
        self.tokens_queried += len(prompt_ids)
        space = self._spaces.get(namespace)
        if not space or len(prompt_ids) <= self.min_tokens:
            return None, 0
        limit = len(prompt_ids) - 1
        query = torch.tensor(prompt_ids[:limit], dtype=torch.long)
        best, best_len = None, 0
        for entry in space.values():
            if need_taps and entry.taps is None:
                continue
            m = min(limit, entry.tokens.numel())
            if m <= best_len:
                continue
            differ = (entry.tokens[:m] != query[:m]).nonzero()
            n = m if differ.numel() == 0 else int(differ[0])
            if n > best_len:
                best, best_len = entry, n
        if best is None or best_len < self.min_tokens:
            return None, 0
        return best, best_len

    def restore(self, slot: int, entry: _Entry, length: int) -> torch.Tensor | None:
        """Write the entry's first `length` positions into `slot` (which must be empty);
        returns the entry's taps for them (None without)."""
        if self.cache.lengths[slot] != 0:
            raise ValueError(f"slot {slot} is not empty")
        for layer, (k, v) in enumerate(zip(entry.k, entry.v)):
            self.cache.k[layer][slot, :, :length].copy_(k[:, :length])
            self.cache.v[layer][slot, :, :length].copy_(v[:, :length])
        self.cache.lengths[slot] = length
        if entry.key in self._entries:
            self._entries.move_to_end(entry.key)
        self.hits += 1
        self.tokens_saved += length
        return None if entry.taps is None else entry.taps[:length]

    def store(self, prompt_ids: list[int], slot: int, taps: torch.Tensor | None,
              namespace: Namespace = None) -> None:
        """Keep a prompt whose prefill just completed in `slot` (its first `max_tokens`
        positions) in `namespace`; `taps` [len(prompt), taps, hidden] when the whole
        prompt's were seen."""
        n = min(len(prompt_ids), self.max_tokens, self.cache.lengths[slot])
        if n < self.min_tokens:
            return
        if taps is not None and (taps.shape[0] < n or taps.numel() == 0):
            taps = None  # not the whole prompt's, or nothing tapped
        key = (namespace, tuple(prompt_ids[:n]))
        old = self._entries.get(key)
        if old is not None and (old.taps is not None or taps is None):
            self._entries.move_to_end(key)
            return
        k = [t[slot, :, :n].clone() for t in self.cache.k]
        v = [t[slot, :, :n].clone() for t in self.cache.v]
        kept = None if taps is None else taps[:n].clone()
        nbytes = sum(t.numel() * t.element_size() for t in (*k, *v)) + (0 if kept is None else
                                                                      kept.numel() * kept.element_size())
        if nbytes > self.max_bytes:
            return
        if old is not None:
            self._drop(old)
        entry = _Entry(key, torch.tensor(key[1], dtype=torch.long), k, v, kept, nbytes)
        self._entries[key] = entry
        self._spaces.setdefault(namespace, {})[key] = entry
        self.bytes += nbytes
        while self.bytes > self.max_bytes:
            self._drop(next(iter(self._entries.values())))

    def _drop(self, entry: _Entry) -> None:
        del self._entries[entry.key]
        space = self._spaces[entry.key[0]]
        del space[entry.key]
        if not space:  # an emptied namespace leaves nothing behind
            del self._spaces[entry.key[0]]
        self.bytes -= entry.nbytes

    def summary(self) -> dict:
        return {"entries": len(self._entries), "namespaces": len(self._spaces), "bytes": self.bytes, "hits": self.hits, "lookups": self.lookups,
                "tokens_queried": self.tokens_queried, "tokens_saved": self.tokens_saved}
