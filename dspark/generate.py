"""Plain (non-speculative) generation for one request: the reference every
speculative path is compared against."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .runtime.batch import FlatBatch
from .runtime.cpu_kernels import argmax_rows
from .runtime.kv_cache import ContextTooLong
from .runtime.target import Target
from .sampling import SamplingParams, StopRule, sample_rows


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
    rule = StopRule(params, () if params.ignore_eos else target.tokenizer.eos_token_ids)
    budget = min(params.max_tokens, max_len - len(prompt_ids))
    out: list[int] = []
    feed, pos = prompt_ids, 0
    first_token_s = 0.0
    finish = "length"
    while len(out) < budget:
        batch = FlatBatch.from_requests([feed], [pos], [slot], device=target.device)
        logits, _ = target.model(batch, cache)
        pos += len(feed)
        tok = int(sample_rows(logits[:1], [params], [gen], argmax_rows(logits[:1]))[0])
        if not out:
            first_token_s = time.perf_counter() - t0
        if rule.stop_token(tok):
            finish = "stop"
            break
        out.append(tok)
        if on_tokens:
            on_tokens([tok])
        if rule.stop_strings and rule.hit_string(target.tokenizer.decode(out)):
            finish = "stop"
            break
        feed = [tok]
    elapsed = time.perf_counter() - t0
    text = rule.cut_text(target.tokenizer.decode(out))
    return GenerationResult(out, text, finish, len(prompt_ids), elapsed, first_token_s)


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
