"""Per-request bookkeeping shared by the weighted drafters (DSpark, DFlash, Eagle3, MTP).

Each request owns a slot of a `KVCachePool` built from the drafter's own layer
config. The drafter tracks the request's context length (target tokens whose hidden
states it has been given); what the pool holds per context token is the subclass's
business (`_truncate_slot` maps a context length onto it).

`reserve(num_slots, max_len)` sizes that memory; without it the first `add_request`
reserves DEFAULT_NUM_SLOTS requests of DEFAULT_MAX_LEN tokens (the pool is
`torch.empty`, so on a CPU untouched pages cost nothing).
"""

from __future__ import annotations

import torch
from torch import nn

from dspark.runtime.kv_cache import KVCachePool
from dspark.runtime.weight_formats import dense_weight, linear_input_dtype

from .base import DraftRequest, Drafter
from .config import DrafterConfig
from .layers import Rotary
from .target_parts import TargetParts

DEFAULT_NUM_SLOTS = 8
DEFAULT_MAX_LEN = 4096


class KVDrafter(Drafter):
    def __init__(self, config: DrafterConfig, target: TargetParts) -> None:
        super().__init__()
        problems = config.check_target(target.cfg)
        if problems:
            raise ValueError("drafter does not fit the target: " + "; ".join(problems))
        self.config = config
        self.target = target
        self.method = config.method
        self.target_layer_ids = list(config.target_layer_ids)
        self.max_draft_tokens = config.max_draft_tokens
        self.layer_config = config.layer_config()
        self.rotary = Rotary(self.layer_config)
        self.pool: KVCachePool | None = None
        self._context_len: list[int] = []  # per slot
        # Reduced draft vocabulary (EAGLE-3/vLLM/SpecForge convention): an own LM head over
        # `draft_vocab_size` target tokens; draft index i is target id i + d2t[i]; t2d marks
        # the target ids inside the draft vocabulary.
        self._t2d_index: torch.Tensor | None = None  # target id -> draft index, built on first use
        if config.reduced_vocab:
            self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
            self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
            self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        else:
            self.lm_head = None

    # --- vocabulary ----------------------------------------------------------------
    def head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Normed drafter hidden [..., H] -> fp32 logits over the DRAFT vocabulary."""
        if self.lm_head is None:
            return self.target.logits(hidden)
        return self.lm_head(hidden.to(linear_input_dtype(self.lm_head))).float()

    def draft_token_ids(self) -> torch.Tensor:
        """[draft vocab] the target id of every draft index."""
        if self.lm_head is None:
            return torch.arange(self.config.vocab_size, device=self.device)
        return torch.arange(self.d2t.shape[0], device=self.d2t.device) + self.d2t

    def set_draft_vocab(self, token_ids: list[int] | torch.Tensor) -> None:
        """Fix the draft vocabulary (target ids, any order: stored sorted) and start the
        own LM head from the target's rows of those tokens."""
        ids = torch.as_tensor(token_ids, dtype=torch.long).unique()  # sorted
        if self.lm_head is None or ids.numel() != self.config.draft_vocab_size:
            raise ValueError(f"a drafter with draft_vocab_size {self.config.draft_vocab_size} needs that many "
                             f"distinct token ids, got {ids.numel()}")
        if int(ids[0]) < 0 or int(ids[-1]) >= self.config.vocab_size:
            raise ValueError("draft vocabulary ids outside the target vocabulary")
        with torch.no_grad():
            dev = self.d2t.device
            self.d2t.copy_((ids - torch.arange(ids.numel())).to(dev))
            self.t2d.zero_()
            self.t2d[ids.to(dev)] = True
            self.lm_head.weight.copy_(dense_weight(self.target.lm_head)[ids.to(self.target.device)].to(self.lm_head.weight))
        self._t2d_index = None

    def to_draft_ids(self, target_ids: torch.Tensor) -> torch.Tensor:
        """Target ids -> draft indices (-1 outside the draft vocabulary)."""
        if self.lm_head is None:
            return target_ids
        index = self._t2d_index
        if index is None or index.device != self.d2t.device:
            index = torch.full((self.config.vocab_size,), -1, dtype=torch.long, device=self.d2t.device)
            index[self.draft_token_ids()] = torch.arange(self.d2t.shape[0], device=self.d2t.device)
            self._t2d_index = index
        return index[target_ids.to(index.device)]

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids if self.lm_head is None else draft_ids + self.d2t[draft_ids]

    def to_target_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits [..., Vd] -> target-vocabulary logits [..., V] with -inf
        outside the draft vocabulary (zero draft probability there: verification stays exact)."""
        if self.lm_head is None:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.config.vocab_size), float("-inf"))
        idx = self.draft_token_ids().expand(*logits.shape[:-1], -1)
        return full.scatter_(-1, idx, logits)

    @property
    def device(self) -> torch.device:
        return self.norm.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.norm.weight.dtype

    # --- memory ------------------------------------------------------------------
    def reserve(self, num_slots: int, max_len: int) -> None:
        if self.pool is not None and self.pool.num_free != self.pool.num_slots:
            raise RuntimeError("reserve() while requests are live; release them first")
        self.pool = KVCachePool(self.layer_config, num_slots, max_len, self.dtype, self.device)
        self._context_len = [0] * num_slots
        self._reserve_extra(num_slots, max_len)

    def _reserve_extra(self, num_slots: int, max_len: int) -> None:
        """Per-slot memory beyond the KV pool (subclasses)."""

    def _ensure_pool(self) -> KVCachePool:
        pool = self.pool
        if pool is None:
            self.reserve(DEFAULT_NUM_SLOTS, DEFAULT_MAX_LEN)
        elif pool.k[0].dtype != self.dtype or pool.k[0].device != self.device:  # the drafter was moved
            self.reserve(pool.num_slots, pool.max_len)
        return self.pool

    # --- requests ----------------------------------------------------------------
    def add_request(self, request_id: object) -> None:
        slot = self._ensure_pool().allocate(request_id)
        self._context_len[slot] = 0

    def release(self, request_id: object) -> None:
        if self.pool is not None:
            self.pool.release(request_id)

    def num_requests(self) -> int:
        return 0 if self.pool is None else self.pool.num_slots - self.pool.num_free

    def slot(self, request_id: object) -> int:
        try:
            return self.pool.slot_of(request_id)  # type: ignore[union-attr]
        except (KeyError, AttributeError):
            raise ValueError(f"request {request_id!r} is not registered with the drafter (add_request first)") from None

    def context_length(self, request_id: object) -> int:
        return self._context_len[self.slot(request_id)]

    def rollback(self, request_id: object, length: int) -> None:
        slot = self.slot(request_id)
        if not 0 <= length <= self._context_len[slot]:
            raise ValueError(f"cannot roll request {request_id!r} of context {self._context_len[slot]} back to {length}")
        self._truncate_slot(slot, length)
        self._context_len[slot] = length

    def _truncate_slot(self, slot: int, length: int) -> None:
        raise NotImplementedError

    # --- shared input checks -------------------------------------------------------
    def _claim_context(
        self,
        request_ids: list[object],
        tokens: list[list[int]],
        start_positions: list[int],
        hidden: torch.Tensor,
    ) -> tuple[list[int], torch.Tensor, torch.Tensor, torch.Tensor]:
        """Validate an `append_context` call, roll requests back to their start positions
        and reserve room. Returns (slot per request, slot per token [N], position per
        token [N], hidden [N, taps, H] on the drafter's device/dtype)."""
        if not len(request_ids) == len(tokens) == len(start_positions):
            raise ValueError("request_ids, tokens and start_positions differ in length")
        if len(set(request_ids)) != len(request_ids):
            raise ValueError("a request appears twice in one append_context call")
        n = sum(len(t) for t in tokens)
        taps, width = len(self.target_layer_ids), self.target.cfg.hidden_size
        if hidden.dim() != 3 or tuple(hidden.shape) != (n, taps, width):
            raise ValueError(
                f"hidden must be [{n} tokens, {taps} tapped layers {self.target_layer_ids}, {width}], "
                f"got {list(hidden.shape)}"
            )
        pool = self._ensure_pool()
        slots = []
        for rid, toks, start in zip(request_ids, tokens, start_positions):
            slot = self.slot(rid)
            if start > self._context_len[slot]:
                raise ValueError(
                    f"request {rid!r}: context starts at {start} but the drafter holds "
                    f"{self._context_len[slot]} tokens (no gaps allowed)"
                )
            pool.check_room(slot, start + len(toks) - pool.lengths[slot])
            if start < self._context_len[slot]:
                self.rollback(rid, start)
            slots.append(slot)
        dev = self.device
        token_slots = torch.tensor([s for s, t in zip(slots, tokens) for _ in t], dtype=torch.long, device=dev)
        positions = torch.tensor(
            [p + j for p, t in zip(start_positions, tokens) for j in range(len(t))], dtype=torch.long, device=dev
        )
        return slots, token_slots, positions, hidden.to(device=dev, dtype=self.dtype)

    def _claim_draft(self, requests: list[DraftRequest], num_tokens: int) -> list[int]:
        if not 1 <= num_tokens <= self.max_draft_tokens:
            raise ValueError(f"{self.method} drafts 1..{self.max_draft_tokens} tokens per call, asked for {num_tokens}")
        slots = []
        for req in requests:
            slot = self.slot(req.request_id)
            if req.anchor_position != self._context_len[slot]:
                raise ValueError(
                    f"request {req.request_id!r}: anchor at position {req.anchor_position} but the drafter "
                    f"holds {self._context_len[slot]} context tokens (append the accepted tokens first)"
                )
            slots.append(slot)
        return slots
