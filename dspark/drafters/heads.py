"""DSpark's two small heads on top of the parallel backbone.

Both work on the backbone's final hidden h_k (after the drafter's final `norm`, the
vector the LM head reads) at block position k = 1..γ, and on the token drafted at
k-1 (the anchor for k = 1).

Markov head: a low-rank transition bias added to the backbone logits,
    z_k = latent(token_{k-1}, h_k)            [rank]
    logits_k = backbone_logits_k + W2 · z_k    (W2: `markov_w2`, linear rank -> vocab)
with the latent per `markov_head_type`:
    vanilla  z_k = W1[token_{k-1}]                        (W1: `markov_w1`, vocab x rank)
    gated    z_k = sigmoid(gate_proj([h_k ; W1[prev]])) * W1[prev]   (`gate_proj`: H+r -> r)
    rnn      z_k = tanh(rnn_input(W1[prev]) + rnn_state(z_{k-1})),  z_0 = 0
             (`rnn_input`: r -> r with bias, `rnn_state`: r -> r; a recurrent state over
             the drafted prefix of the block)

Confidence head: c_k = sigmoid(proj([h_k ; z_k]) / T_k), proj = `confidence_head.proj`
(Linear(H + r -> 1), a logit; input h_k alone when `confidence_head_with_markov` is
false). T_k are the per-position STS temperatures (1 until calibrated).

For training, `MarkovHead.block_latents` computes every z_k of whole blocks from the
TRUE previous tokens (teacher forcing) in one call; drafting goes left to right with
`MarkovHead.latent`.
"""

from __future__ import annotations

import torch
from torch import nn

from dspark.runtime.weight_formats import linear_input_dtype


class MarkovHead(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, rank: int, kind: str = "vanilla",
                 out_vocab_size: int | None = None) -> None:
        """`vocab_size`: previous tokens (target ids); `out_vocab_size`: the biased logits
        (the draft vocabulary, default the same)."""
        super().__init__()
        self.kind = kind
        self.rank = rank
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, out_vocab_size or vocab_size, bias=False)
        if kind == "gated":
            self.gate_proj = nn.Linear(hidden_size + rank, rank)
        elif kind == "rnn":
            self.rnn_input = nn.Linear(rank, rank)
            self.rnn_state = nn.Linear(rank, rank, bias=False)
        elif kind != "vanilla":
            raise ValueError(f"unknown markov_head_type {kind!r}")

    def latent(
        self,
        prev_tokens: torch.Tensor,  # [...] int64, the token at the previous block position
        hidden: torch.Tensor,  # [..., H] h_k
        state: torch.Tensor | None = None,  # [..., rank] z_{k-1} (rnn only; None at k = 1)
    ) -> torch.Tensor:
        """z_k [..., rank]; for `rnn` it is also the state for position k+1."""
        e = self.markov_w1(prev_tokens)
        if self.kind == "gated":
            return torch.sigmoid(self.gate_proj(torch.cat([hidden.to(e.dtype), e], dim=-1))) * e
        if self.kind == "rnn":
            pre = self.rnn_input(e)
            if state is not None:
                pre = pre + self.rnn_state(state)
            return torch.tanh(pre)
        return e

    def bias(self, latent: torch.Tensor) -> torch.Tensor:
        """W2 · z: [..., vocab]."""
        return self.markov_w2(latent)

    def block_latents(
        self,
        prev_tokens: torch.Tensor,  # [..., K] int64: position k holds token_{k-1} (anchor first)
        hidden: torch.Tensor,  # [..., K, H]
    ) -> torch.Tensor:
        """Teacher-forced z for every block position at once: [..., K, rank]. The last
        axis of `prev_tokens` is the block position (the rnn recurs along it)."""
        if self.kind != "rnn":
            return self.latent(prev_tokens, hidden)
        out, state = [], None
        for k in range(prev_tokens.shape[-1]):
            state = self.latent(prev_tokens[..., k], hidden[..., k, :], state)
            out.append(state)
        return torch.stack(out, dim=-2)


class ConfidenceHead(nn.Module):
    def __init__(self, hidden_size: int, markov_rank: int, num_positions: int) -> None:
        """`markov_rank` 0 = the input is h_k alone; `num_positions` = γ (for the
        per-position temperatures)."""
        super().__init__()
        self.with_markov = markov_rank > 0
        self.num_positions = num_positions
        self.proj = nn.Linear(hidden_size + markov_rank, 1)
        # STS temperatures; kept out of the state dict (they live in calibration.json).
        self.temperatures: list[float] = [1.0] * num_positions
        self.calibrated = False

    def set_temperatures(self, temperatures: list[float]) -> None:
        temps = [float(t) for t in temperatures]
        if len(temps) != self.num_positions:
            raise ValueError(f"expected {self.num_positions} temperatures (one per drafted position), got {len(temps)}")
        if not all(t > 0 for t in temps):
            raise ValueError(f"temperatures must be positive, got {temps}")
        self.temperatures = temps
        self.calibrated = True

    def logit(
        self,
        hidden: torch.Tensor,  # [..., K, H]
        latent: torch.Tensor | None,  # [..., K, rank]
    ) -> torch.Tensor:
        """Raw confidence logit before temperature: [..., K] (fp32)."""
        x = torch.cat([hidden, latent.to(hidden.dtype)], dim=-1) if self.with_markov else hidden
        return self.proj(x.to(linear_input_dtype(self.proj))).squeeze(-1).float()

    def at(self, hidden: torch.Tensor, latent: torch.Tensor | None, k: int) -> torch.Tensor:
        """c for block position k+1 alone: hidden [..., H], latent [..., rank] -> [...]."""
        logit = self.logit(hidden.unsqueeze(-2), None if latent is None else latent.unsqueeze(-2)).squeeze(-1)
        return torch.sigmoid(logit / self.temperatures[k])

    def forward(self, hidden: torch.Tensor, latent: torch.Tensor | None) -> torch.Tensor:
        """c_k in (0, 1) for block positions 1..K: [..., K] (fp32)."""
        logit = self.logit(hidden, latent)
        k = logit.shape[-1]
        temps = torch.tensor(self.temperatures[:k], dtype=torch.float32, device=logit.device)
        return torch.sigmoid(logit / temps)
