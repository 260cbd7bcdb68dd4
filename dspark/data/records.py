"""The on-disk format of regenerated responses: JSONL, one record per line.

```
{"id": "gsm8k/0042",                      # Prompt.id, unique in a file
 "domain": "math", "source": "gsm8k",
 "messages": [{"role": "user", "content": "..."}],   # the prompt, OpenAI chat format
 "prompt_token_ids": [...],               # chat template applied, generation prompt added
 "response_token_ids": [...],             # the reply, without the stop token
 "response_text": "...",
 "finish_reason": "stop" | "length",
 "stop_token_id": 2 | null,               # the token that ended the reply (runtime only)
 "seed": 123456789,                       # this record's sampling seed
 "generator": {"model": ..., "backend": "dspark" | "server", "temperature": 0.7,
               "top_p": 0.8, "top_k": 20, "max_tokens": 256, "seed": 0, ...},
 "format": 1}
```

Token ids come from the runtime when it generated the reply; a server returns text
only, so its reply is tokenized with our tokenizer (`response_token_ids` is then the
tokenizer's encoding of the text, which may differ from the ids the server sampled).
To train, append the model's end-of-turn token when `finish_reason` is "stop".

Lines are appended as replies finish, in no particular order; a run that stops
(crash, Ctrl-C) is resumed by running it again: ids already in the file are skipped
and a torn last line is cut off. Every record of one file has the same `generator`.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator
from pathlib import Path

from .prompts import Prompt
from .sources import DataError

FORMAT_VERSION = 1


def make_record(
    prompt: Prompt,
    prompt_token_ids: list[int],
    response_token_ids: list[int],
    response_text: str,
    finish_reason: str,
    generator: dict,
    seed: int,
    stop_token_id: int | None = None,
) -> dict:
    return {
        "id": prompt.id,
        "domain": prompt.domain,
        "source": prompt.source,
        "messages": prompt.messages,
        "prompt_token_ids": prompt_token_ids,
        "response_token_ids": response_token_ids,
        "response_text": response_text,
        "finish_reason": finish_reason,
        "stop_token_id": stop_token_id,
        "seed": seed,
        "generator": generator,
        "format": FORMAT_VERSION,
    }


def read_records(path: str | Path) -> Iterator[dict]:
    """Every complete record of a file; a torn last line (a run killed mid-write) is skipped.
    A path ending in `.gz` is read through gzip (a data set kept compressed, read-only)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.endswith("\n"):
                return
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}:{n} is not a JSON record ({e}); is this a dspark data file?") from None


class RecordWriter:
    """Appends records to a JSONL file, one flushed line each, so that a killed run
    loses at most the line being written. Opening cuts a torn last line."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if self.path.suffix == ".gz":
            raise DataError(f"{path}: records are appended to a plain .jsonl file; gzip it once it is complete")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _cut_torn_tail(self.path)
        self._f = open(self.path, "a", encoding="utf-8")

    def write(self, record: dict) -> None:
        self._f.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def existing_ids(path: str | Path, generator: dict) -> set[str]:
    """Ids already written to `path` (none if it does not exist). Raises `DataError`
    when the file was written with other generation settings, which resuming would mix."""
    path = Path(path)
    if not path.exists():
        return set()
    done: set[str] = set()
    for rec in read_records(path):
        if "id" not in rec or "generator" not in rec:
            raise DataError(f"{path} holds a line without id/generator; is this a dspark data file?")
        if rec["generator"] != generator:
            old = rec["generator"]
            diff = [f"{k}: {old.get(k)!r} there, {v!r} now" for k, v in generator.items() if old.get(k) != v]
            raise DataError(
                f"{path} was generated with other settings ({'; '.join(diff) or 'other keys'}); "
                "resume with the same settings or write to a new --out file"
            )
        done.add(rec["id"])
    return done


def _cut_torn_tail(path: Path) -> None:
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as f:
        f.seek(-1, os.SEEK_END)
        if f.read(1) == b"\n":
            return
        f.seek(0)
        keep = f.read().rfind(b"\n") + 1
        f.truncate(keep)
