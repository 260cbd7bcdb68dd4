"""Plain (non-speculative) generation for one request: the reference every
speculative path is compared against."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .runtime.batch import FlatBatch
from .runtime.kv_cache import ContextTooLong
from .runtime.target import Target
from .sampling import SamplingParams, logits_to_probs, sample_from_probs


@dataclass
class GenerationResult:
    token_ids: list[int]
    text: str
    finish_reason: str  # "stop" | "length"
    prompt_tokens: int
    elapsed_s: float
    first_token_s: float
    stats: dict = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        decode = self.elapsed_s - self.first_token_s
        n = len(self.token_ids) - 1
        return n / decode if n > 0 and decode > 0 else float("nan")


class StopChecker:
    """Stop tokens and stop strings. A matched stop string is cut from the text."""

    def __init__(self, target: Target, params: SamplingParams) -> None:
        self.stop_ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            self.stop_ids.update(target.tokenizer.eos_token_ids)
        self.stop_strings = [s for s in params.stop if s]
        self.tokenizer = target.tokenizer

    def cut(self, ids: list[int]) -> tuple[list[int], bool]:
        """Truncate `ids` at the first stop token; returns (ids, stopped)."""
        for i, t in enumerate(ids):
            if t in self.stop_ids:
                return ids[:i], True
        if self.stop_strings:
            text = self.tokenizer.decode(ids)
            if any(s in text for s in self.stop_strings):
                return ids, True
        return ids, False

    def final_text(self, ids: list[int]) -> str:
        text = self.tokenizer.decode(ids)
        cut = min((text.find(s) for s in self.stop_strings if s in text), default=-1)
        return text[:cut] if cut >= 0 else text


def check_prompt(target: Target, prompt_ids: list[int], max_len: int) -> None:
    if not prompt_ids:
        raise ValueError("the prompt is empty")
    if len(prompt_ids) >= max_len:
        raise ContextTooLong(
            f"the prompt has {len(prompt_ids)} tokens, which leaves no room in the context "
            f"of {max_len} tokens; shorten it or raise --max-model-len"
        )


@torch.inference_mode()
def generate_plain(
    target: Target,
    prompt_ids: list[int],
    params: SamplingParams,
    on_tokens: Callable[[list[int]], None] | None = None,
    max_len: int = 4096,
) -> GenerationResult:
    check_prompt(target, prompt_ids, max_len)
    t0 = time.perf_counter()
    cache = target.new_cache(1, max_len)
    slot = cache.allocate(0)
    gen = torch.Generator(device=target.device)
    gen.manual_seed(params.seed if params.seed is not None else torch.seed())
    stopper = StopChecker(target, params)
    budget = min(params.max_tokens, max_len - len(prompt_ids))
    out: list[int] = []
    feed, pos = prompt_ids, 0
    first_token_s = 0.0
    finish = "length"
    while len(out) < budget:
        batch = FlatBatch.from_requests([feed], [pos], [slot], device=target.device)
        logits, _ = target.model(batch, cache)
        pos += len(feed)
        if params.greedy:
            tok = int(logits[0].argmax())
        else:
            probs = logits_to_probs(logits[0], params.temperature, params.top_k, params.top_p)
            tok = sample_from_probs(probs, gen)
        if not out:
            first_token_s = time.perf_counter() - t0
        kept, stopped = stopper.cut([tok])
        out.extend(kept)
        if kept and on_tokens:
            on_tokens(kept)
        if stopped or (stopper.stop_strings and stopper.cut(out)[1]):
            finish = "stop"
            break
        feed = [tok]
    elapsed = time.perf_counter() - t0
    return GenerationResult(out, stopper.final_text(out), finish, len(prompt_ids), elapsed, first_token_s)


def generate_speculative(
    target,
    prompt_ids: list[int],
    params,
    spec: SpeculativeConfig,
    on_tokens: Callable[[list[int]], None] | None = None,
    max_len: int = 4096,
):
    """One prompt through the engine with speculation; returns a GenerationResult
    whose `stats` carry the acceptance statistics."""
    from dspark.engine.engine import EngineConfig, LLMEngine

    check_prompt(target, prompt_ids, max_len)
    engine = LLMEngine(target, spec, EngineConfig(max_num_seqs=1, max_model_len=max_len))
    t0 = time.perf_counter()
    seq = engine.add_request(prompt_ids, params)
    first = 0.0
    while not seq.is_finished:
        for out in engine.step():
            if out.new_tokens:
                if not first:
                    first = time.perf_counter() - t0
                if on_tokens:
                    on_tokens(out.new_tokens)
    elapsed = time.perf_counter() - t0
    stats = {"method": spec.method, "policy": spec.policy, **seq.stats.as_dict()}
    return GenerationResult(seq.output_ids, engine.final_text(seq), seq.finish_reason or "length",
                            len(prompt_ids), elapsed, first, stats)
