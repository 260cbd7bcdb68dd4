"""Batched plain decoding for bulk generation ("continuous batching lite").

Up to `batch_size` requests hold a KV slot each. A newly admitted request is
prefilled on its own (on a CPU prefill is compute-bound, so grouping prompts buys
little, and a lone prefill is exactly the computation `generate_plain` does); then
every running request advances by one token in a single `Transformer.forward` over
a `FlatBatch`. A request that stops leaves at once and the next one takes its slot.

Each request samples with its own `torch.Generator` seeded from its
`SamplingParams.seed`, one float64 uniform per token as in `generate_plain`, so its
tokens depend on its own seed and logits only, not on which requests share its
batch. Stop handling mirrors `generate_plain`: the stop token is not part of the
output, and greedy decoding yields the same tokens.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch

from ..generate import StopChecker, check_prompt
from ..runtime.batch import FlatBatch
from ..runtime.kv_cache import KVCachePool
from ..runtime.target import Target
from ..sampling import SamplingParams, logits_to_probs, sample_from_probs


@dataclass
class DecodeRequest:
    key: str
    prompt_ids: list[int]
    params: SamplingParams  # seed None = a fresh random seed


@dataclass
class DecodeOutput:
    key: str
    prompt_ids: list[int]
    token_ids: list[int]  # without the stop token
    text: str
    finish_reason: str  # "stop" | "length"
    stop_token_id: int | None  # the token that ended the reply, if a token did


@dataclass
class _Running:
    req: DecodeRequest
    slot: int
    generator: torch.Generator
    stopper: StopChecker
    budget: int  # tokens this request may still produce in total
    out: list[int] = field(default_factory=list)
    finish: str | None = None
    stop_token_id: int | None = None

    @property
    def feed_position(self) -> int:
        """Position of the last sampled token, which the next step feeds."""
        return len(self.req.prompt_ids) + len(self.out) - 1


class BatchDecoder:
    def __init__(self, target: Target, batch_size: int = 16, max_len: int = 2048) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.target = target
        self.batch_size = batch_size
        self.max_len = max_len

    @torch.inference_mode()
    def run(self, requests: Iterable[DecodeRequest]) -> Iterator[DecodeOutput]:
        """Decode every request; outputs come in the order requests finish."""
        cache = self.target.new_cache(self.batch_size, self.max_len)
        pending = iter(requests)
        running: list[_Running] = []
        exhausted = False
        while True:
            while not exhausted and cache.num_free:
                req = next(pending, None)
                if req is None:
                    exhausted = True
                    break
                r = self._prefill(req, cache)
                if r.finish:
                    yield self._finish(r, cache)
                else:
                    running.append(r)
            if not running:
                return
            self._decode_step(running, cache)
            for r in running:
                if r.finish:
                    yield self._finish(r, cache)
            running = [r for r in running if not r.finish]

    def _prefill(self, req: DecodeRequest, cache: KVCachePool) -> _Running:
        check_prompt(self.target, req.prompt_ids, self.max_len)
        gen = torch.Generator(device=self.target.device)
        gen.manual_seed(req.params.seed if req.params.seed is not None else torch.seed())
        r = _Running(req, cache.allocate(req.key), gen, StopChecker(self.target, req.params),
                     min(req.params.max_tokens, self.max_len - len(req.prompt_ids)))
        batch = FlatBatch.from_requests([req.prompt_ids], [0], [r.slot], device=self.target.device)
        logits, _ = self.target.model(batch, cache)  # [1, vocab]
        self._accept(r, self._sample([r], logits)[0])
        return r

    def _decode_step(self, running: list[_Running], cache: KVCachePool) -> None:
        batch = FlatBatch.from_requests(
            [[r.out[-1]] for r in running],  # a running request has sampled at least one token
            [r.feed_position for r in running],
            [r.slot for r in running],
            device=self.target.device,
        )
        logits, _ = self.target.model(batch, cache)  # [num_running, vocab]
        for r, tok in zip(running, self._sample(running, logits)):
            self._accept(r, tok)

    def _sample(self, reqs: list[_Running], logits: torch.Tensor) -> list[int]:
        """One token per row of `logits` [len(reqs), vocab]."""
        greedy = [r.req.params.greedy for r in reqs]
        tokens = logits.argmax(-1).tolist() if any(greedy) else [0] * len(reqs)
        rows = [i for i, g in enumerate(greedy) if not g]
        if not rows:
            return tokens
        ps = [reqs[i].req.params for i in rows]
        x = logits[rows]  # [num_sampled, vocab]
        kmax = max(p.top_k for p in ps)
        candidates = None
        if min(p.top_k for p in ps) > 0 and kmax < x.shape[-1]:
            # Only the top-k can be sampled; narrowing to them first skips a sort of
            # the whole vocabulary per row, the costliest part of a CPU decode step.
            # Candidates stay in token-id order, the order of the inverse CDF, so a
            # uniform picks the same token as on the full row (ties at the k-th logit
            # aside, which neither path orders).
            candidates = x.topk(kmax, dim=-1).indices.sort(dim=-1).values  # [num_sampled, kmax]
            x = x.gather(1, candidates)
        dev = logits.device
        probs = logits_to_probs(
            x,
            torch.tensor([p.temperature for p in ps], device=dev),
            torch.tensor([p.top_k for p in ps], device=dev),
            torch.tensor([p.top_p for p in ps], device=dev),
        )
        for j, i in enumerate(rows):
            tok = sample_from_probs(probs[j], reqs[i].generator)
            tokens[i] = int(candidates[j, tok]) if candidates is not None else tok
        return tokens

    @staticmethod
    def _accept(r: _Running, tok: int) -> None:
        kept, stopped = r.stopper.cut([tok])
        r.out.extend(kept)
        if stopped or (r.stopper.stop_strings and r.stopper.cut(r.out)[1]):
            r.finish = "stop"
            r.stop_token_id = None if kept else tok
        elif len(r.out) >= r.budget:
            r.finish = "length"

    def _finish(self, r: _Running, cache: KVCachePool) -> DecodeOutput:
        cache.release(r.req.key)
        return DecodeOutput(r.req.key, r.req.prompt_ids, r.out, r.stopper.final_text(r.out),
                            r.finish or "length", r.stop_token_id)
