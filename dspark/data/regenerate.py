"""Regenerate responses: the target answers training prompts itself.

`regenerate(prompts, out, backend, config)` appends one record per prompt to a JSONL
file (format in `records.py`), skipping ids the file already holds, so an
interrupted run is resumed by running it again. Two backends:

- `LocalBackend`: our runtime, the engine without speculation (continuous batching);
- `ServerBackend`: any OpenAI-compatible server, a few requests in flight at once.

Every prompt samples with its own seed, derived from the run seed and the prompt id
(`prompt_seed`), so a record does not depend on batch size, concurrency, order or
resumption; the seed is passed to the server too.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..runtime.target import Target
from ..runtime.tokenizer import Tokenizer
from ..sampling import SamplingParams
from .chat_client import ChatClient
from .prompts import Prompt
from .records import RecordWriter, existing_ids, make_record
from .sources import DataError


@dataclass
class RegenConfig:
    """Sampling for regeneration; the defaults are the public DSpark recipe's."""

    temperature: float = 0.7
    top_p: float = 0.8
    top_k: int = 20
    max_tokens: int = 256
    seed: int = 0
    max_prompt_tokens: int = 1024  # longer prompts are skipped

    def __post_init__(self) -> None:
        self.params(0)  # validates the sampling fields
        if self.max_prompt_tokens < 1:
            raise DataError(f"max_prompt_tokens must be >= 1, got {self.max_prompt_tokens}")

    def params(self, seed: int) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                              max_tokens=self.max_tokens, seed=seed)

    def sampling_info(self) -> dict:
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                "max_tokens": self.max_tokens, "seed": self.seed}


def prompt_seed(seed: int, prompt_id: str) -> int:
    """The sampling seed of one prompt: a 63-bit hash of the run seed and its id."""
    digest = hashlib.sha256(f"{seed}/{prompt_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


@dataclass
class Work:
    prompt: Prompt
    prompt_token_ids: list[int]
    seed: int


@dataclass
class Reply:
    work: Work
    token_ids: list[int]
    text: str
    finish_reason: str
    stop_token_id: int | None = None


class Backend(Protocol):
    tokenizer: Tokenizer

    def generator_info(self) -> dict: ...

    def run(self, work: Iterator[Work], config: RegenConfig) -> Iterator[Reply]: ...


class LocalBackend:
    def __init__(self, target: Target, batch_size: int = 16, max_len: int = 2048) -> None:
        self.target = target
        self.tokenizer = target.tokenizer
        self.batch_size = batch_size
        self.max_len = max_len

    def generator_info(self) -> dict:
        from ..runtime.default_model import DEFAULT_MODEL_NAME

        name = DEFAULT_MODEL_NAME if self.target.name == "default" else self.target.name
        return {"model": name, "backend": "dspark", "dtype": str(self.target.dtype).removeprefix("torch.")}

    def run(self, work: Iterator[Work], config: RegenConfig) -> Iterator[Reply]:
        if config.max_prompt_tokens >= self.max_len:
            raise DataError(f"max prompt tokens ({config.max_prompt_tokens}) must be below the maximum "
                            f"model length ({self.max_len}); lower one or raise the other")
        from ..engine.engine import EngineConfig, LLMEngine

        # KV slots only as long as a request can grow: less memory to zero and hold.
        engine = LLMEngine(self.target, None, EngineConfig(
            max_num_seqs=self.batch_size, max_model_len=min(self.max_len, config.max_prompt_tokens + config.max_tokens)))
        pending: dict[str, Work] = {}

        def requests() -> Iterator[tuple[str, list[int], SamplingParams]]:
            for w in work:
                pending[w.prompt.id] = w
                yield w.prompt.id, w.prompt_token_ids, config.params(w.seed)

        for seq in engine.run(requests()):
            yield Reply(pending.pop(seq.request_id), seq.output_ids, engine.final_text(seq),
                        seq.finish_reason or "length", seq.stop_token_id)


class ServerBackend:
    def __init__(self, client: ChatClient, tokenizer: Tokenizer, concurrency: int = 8) -> None:
        if concurrency < 1:
            raise DataError(f"concurrency must be >= 1, got {concurrency}")
        self.client = client
        self.tokenizer = tokenizer
        self.concurrency = concurrency

    def generator_info(self) -> dict:
        return {"model": self.client.model, "backend": "server"}

    def run(self, work: Iterator[Work], config: RegenConfig) -> Iterator[Reply]:
        def call(w: Work) -> Reply:
            r = self.client.complete(w.prompt.messages, config.params(w.seed))
            return Reply(w, self.tokenizer.encode(r.text), r.text, r.finish_reason)

        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="regen") as pool:
            in_flight: set[Future] = set()
            try:
                for w in work:
                    in_flight.add(pool.submit(call, w))
                    if len(in_flight) >= self.concurrency:
                        finished, in_flight = wait(in_flight, return_when=FIRST_COMPLETED)
                        yield from (f.result() for f in finished)
                while in_flight:
                    finished, in_flight = wait(in_flight, return_when=FIRST_COMPLETED)
                    yield from (f.result() for f in finished)
            finally:
                for f in in_flight:
                    f.cancel()


@dataclass
class RegenSummary:
    written: int = 0
    already_done: int = 0
    too_long: int = 0
    response_tokens: int = 0
    elapsed_s: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.response_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0


def regenerate(
    prompts: list[Prompt],
    out_path: str | Path,
    backend: Backend,
    config: RegenConfig,
    progress: bool = True,
) -> RegenSummary:
    """Answer every prompt not yet in `out_path` and append the records."""
    from tqdm import tqdm

    generator = {**backend.generator_info(), **config.sampling_info()}
    done = existing_ids(out_path, generator)
    todo = [p for p in prompts if p.id not in done]
    summary = RegenSummary(already_done=len(prompts) - len(todo))
    bar = tqdm(total=len(todo), unit="prompt", desc="generate", disable=not progress, dynamic_ncols=True)
    t0 = time.perf_counter()

    def work() -> Iterator[Work]:
        for p in todo:
            ids = backend.tokenizer.apply_chat_template(p.messages)
            if len(ids) > config.max_prompt_tokens:
                summary.too_long += 1
                bar.update(1)
                continue
            yield Work(p, ids, prompt_seed(config.seed, p.id))

    try:
        with RecordWriter(out_path) as writer:
            for r in backend.run(work(), config):
                writer.write(make_record(r.work.prompt, r.work.prompt_token_ids, r.token_ids, r.text,
                                         r.finish_reason, generator, r.work.seed, r.stop_token_id))
                summary.written += 1
                summary.response_tokens += len(r.token_ids)
                summary.elapsed_s = time.perf_counter() - t0
                bar.set_postfix_str(f"{summary.tokens_per_s:.1f} tok/s", refresh=False)
                bar.update(1)
    finally:
        bar.close()
        summary.elapsed_s = time.perf_counter() - t0
    return summary
