"""The flattened batch the target runtime executes in one forward."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class FlatBatch:
    """Tokens of many requests laid end to end.

    Request i owns rows `cu_seqlens[i]:cu_seqlens[i+1]` of `input_ids`/`positions`,
    with consecutive positions that continue its KV cache (the first position equals
    the cache length, or less after a rollback). `slots[i]` is its KV-cache slot.
    `logit_rows` selects the rows that need logits (None: every row).
    """

    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    slots: list[int]  # [num_requests]
    cu_seqlens: list[int]  # [num_requests + 1]
    logit_rows: torch.Tensor | None = None  # [num_logits] int64

    def __post_init__(self) -> None:
        n = self.input_ids.numel()
        if self.positions.numel() != n:
            raise ValueError("input_ids and positions differ in length")
        if len(self.cu_seqlens) != len(self.slots) + 1 or self.cu_seqlens[0] != 0 or self.cu_seqlens[-1] != n:
            raise ValueError(f"cu_seqlens {self.cu_seqlens} does not cover {n} tokens of {len(self.slots)} requests")
        if any(b <= a for a, b in zip(self.cu_seqlens, self.cu_seqlens[1:])):
            raise ValueError("every request in a batch needs at least one token")

    @property
    def num_requests(self) -> int:
        return len(self.slots)

    @property
    def seq_lens(self) -> list[int]:
        return [b - a for a, b in zip(self.cu_seqlens, self.cu_seqlens[1:])]

    @classmethod
    def from_requests(
        cls,
        tokens: list[list[int]],
        start_positions: list[int],
        slots: list[int],
        logits: str = "last",
        device: torch.device | str = "cpu",
    ) -> "FlatBatch":
        """Build a batch; `logits` is "last" (one row per request), "all" or "none"."""
        cu = [0]
        for t in tokens:
            cu.append(cu[-1] + len(t))
        ids = torch.tensor([x for t in tokens for x in t], dtype=torch.long, device=device)
        pos = torch.tensor(
            [p + j for t, p in zip(tokens, start_positions) for j in range(len(t))],
            dtype=torch.long,
            device=device,
        )
        if logits == "last":
            rows = torch.tensor([c - 1 for c in cu[1:]], dtype=torch.long, device=device)
        elif logits == "all":
            rows = None
        elif logits == "none":
            rows = torch.zeros(0, dtype=torch.long, device=device)
        else:
            raise ValueError(f"logits must be last/all/none, got {logits!r}")
        return cls(ids, pos, list(slots), cu, rows)

