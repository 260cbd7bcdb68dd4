"""Per-request KV memory with rollback.

The pool holds one fixed-capacity row ("slot") per running request for every layer:
`k[layer]` is `[num_slots, num_kv_heads, max_len, head_dim]`. A request owns a slot
from `allocate` to `release`; `truncate` rolls it back (rejected draft tokens) by
moving its length only, since stale entries past the length are never attended.

The pool is allocated with `torch.empty`, so on a CPU the operating system backs only
the pages that are written: a large `num_slots * max_len` costs memory only as
requests actually grow. The configured budget bounds `num_slots * max_len` tokens.
"""

from __future__ import annotations

import torch

from dspark.errors import UserError

from .config import ModelConfig


class KVCacheFull(RuntimeError):
    """No free slot (too many running requests for the configured memory budget)."""


class ContextTooLong(UserError, ValueError):
    """A request would grow past the per-request maximum length."""


class KVCachePool:
    def __init__(
        self,
        cfg: ModelConfig,
        num_slots: int,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> None:
        if num_slots <= 0 or max_len <= 0:
            raise ValueError(f"num_slots and max_len must be positive, got {num_slots}, {max_len}")
        self.cfg = cfg
        self.num_slots = num_slots
        self.max_len = max_len
        shape = (num_slots, cfg.num_kv_heads, max_len, cfg.head_dim)
        self.k = [torch.empty(shape, dtype=dtype, device=device) for _ in range(cfg.num_layers)]
        self.v = [torch.empty(shape, dtype=dtype, device=device) for _ in range(cfg.num_layers)]
        self.lengths = [0] * num_slots
        # Positions below this are initialised in every slot (see `ensure_initialized`).
        self.initialized_len = 0
        self._owner: dict[object, int] = {}
        self._free = list(range(num_slots - 1, -1, -1))  # pop() hands out low slots first

    @staticmethod
    def bytes_per_token(cfg: ModelConfig, dtype: torch.dtype) -> int:
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * itemsize

    # --- ownership -------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, owner: object) -> int:
        if owner in self._owner:
            raise ValueError(f"{owner!r} already holds slot {self._owner[owner]}")
        if not self._free:
            raise KVCacheFull(
                f"all {self.num_slots} KV slots are in use; release a request or raise the "
                "KV memory budget"
            )
        slot = self._free.pop()
        self._owner[owner] = slot
        self.lengths[slot] = 0
        return slot

    def slot_of(self, owner: object) -> int:
        return self._owner[owner]

    def release(self, owner: object) -> None:
        slot = self._owner.pop(owner, None)
        if slot is None:
            return
        self.lengths[slot] = 0
        self._free.append(slot)
        self._free.sort(reverse=True)

    def truncate(self, slot: int, length: int) -> None:
        if length < 0 or length > self.lengths[slot]:
            raise ValueError(f"cannot truncate slot {slot} of length {self.lengths[slot]} to {length}")
        self.lengths[slot] = length

    def ensure_initialized(self, kv_len: int) -> None:
        """Zero never-written cache memory below `kv_len`.

        Attention reads keys/values up to the longest request of a batch and masks
        the rest; a masked weight of exactly 0 still turns a NaN value from
        uninitialised memory into NaN. Zeroing grows in chunks for every slot at
        once, so it happens rarely and touches memory only as far as the longest
        request has reached.
        """
        if kv_len <= self.initialized_len:
            return
        new = min(self.max_len, max(kv_len, 2 * self.initialized_len, 256))
        for t in (*self.k, *self.v):
            t[:, :, self.initialized_len : new].zero_()
        self.initialized_len = new

    def check_room(self, slot: int, extra: int) -> None:
        if self.lengths[slot] + extra > self.max_len:
            raise ContextTooLong(
                f"request would reach {self.lengths[slot] + extra} tokens, over the maximum "
                f"model length {self.max_len}"
            )
