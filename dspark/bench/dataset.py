"""The prompts a benchmark sends.

Sources: the held-out sets of `dspark.data` (`math` = GSM8K test tail, `code` =
HumanEval, `chat` = MT-Bench first turns, `mixed` = the three in equal shares; a
set that runs out, MT-Bench after 80, leaves its share to the others), or a
JSONL file with one object per line holding either
`"prompt": "text"` or `"messages": [{"role": ..., "content": ...}, ...]`, and
optionally `"max_tokens"` for that request.

A chat prompt sent to `/v1/completions` becomes its message contents joined by
blank lines (no chat template: the bench knows no tokenizer); a plain prompt sent
to `/v1/chat/completions` becomes one user message.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from dspark.errors import UserError

DATASETS = ("math", "code", "chat", "mixed")


class DatasetError(UserError, ValueError):
    """A prompt source is missing or malformed; the message says what to fix."""


@dataclass(frozen=True)
class BenchPrompt:
    messages: tuple[dict, ...] | None = None
    prompt: str | None = None
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if (self.messages is None) == (self.prompt is None):
            raise DatasetError("a benchmark prompt has either messages or a prompt, not both")

    def chat_messages(self) -> list[dict]:
        if self.messages is not None:
            return [dict(m) for m in self.messages]
        return [{"role": "user", "content": self.prompt}]

    def completion_prompt(self) -> str:
        if self.prompt is not None:
            return self.prompt
        return "\n\n".join(_content_text(m.get("content")) for m in self.messages)


def _content_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def heldout_prompts(dataset: str, num: int | None = None) -> list[BenchPrompt]:
    """The held-out prompts of one domain, or `num` (all when None) of the three
    domains in equal shares for `mixed`."""
    from dspark.data import DataError, load_prompts, select_prompts

    if dataset not in DATASETS:
        raise DatasetError(f"--dataset must be one of {', '.join(DATASETS)}, got {dataset!r}")
    try:
        if dataset == "mixed":
            prompts = select_prompts(load_prompts("heldout"), {"math": 1 / 3, "code": 1 / 3, "chat": 1 / 3}, num)
        else:
            prompts = load_prompts("heldout", dataset)
    except DataError as e:
        raise DatasetError(str(e)) from None
    return [BenchPrompt(messages=tuple(p.messages)) for p in prompts]


def jsonl_prompts(path: str | Path) -> list[BenchPrompt]:
    path = Path(path).expanduser()
    if not path.is_file():
        raise DatasetError(f"--dataset-path {str(path)!r} is not a file")
    prompts = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetError(f"{where} is not valid JSON: {e}") from None
            prompts.append(_row_prompt(row, where))
    if not prompts:
        raise DatasetError(f"{path} holds no prompts; write one JSON object per line")
    return prompts


def _row_prompt(row: object, where: str) -> BenchPrompt:
    if not isinstance(row, dict):
        raise DatasetError(f"{where}: each line must be a JSON object with \"prompt\" or \"messages\"")
    max_tokens = row.get("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)
                                   or max_tokens < 1):
        raise DatasetError(f"{where}: \"max_tokens\" must be a positive integer, got {max_tokens!r}")
    if isinstance(row.get("prompt"), str) and row["prompt"]:
        return BenchPrompt(prompt=row["prompt"], max_tokens=max_tokens)
    messages = row.get("messages")
    if isinstance(messages, list) and messages and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m for m in messages):
        return BenchPrompt(messages=tuple(messages), max_tokens=max_tokens)
    raise DatasetError(f"{where}: expected a non-empty \"prompt\" string or a \"messages\" list of "
                       "{\"role\", \"content\"} objects")


def sample_prompts(pool: list[BenchPrompt], num: int, seed: int) -> list[BenchPrompt]:
    """`num` prompts in a seeded random order; the pool repeats (reshuffled each
    pass) when it is smaller than `num`."""
    if not pool:
        raise DatasetError("no prompts to send")
    rng = random.Random(seed)
    out: list[BenchPrompt] = []
    while len(out) < num:
        order = list(pool)
        rng.shuffle(order)
        out.extend(order[: num - len(out)])
    return out


def load_bench_prompts(dataset: str, dataset_path: str | None, num: int, seed: int) -> list[BenchPrompt]:
    pool = jsonl_prompts(dataset_path) if dataset_path else heldout_prompts(dataset, num)
    return sample_prompts(pool, num, seed)
