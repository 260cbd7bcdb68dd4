"""Tokenizer and chat template, from transformers (local files only, no remote code)."""

from __future__ import annotations

from pathlib import Path


class Tokenizer:
    def __init__(self, path: str | Path, extra_eos_ids: list[int] | tuple[int, ...] = ()) -> None:
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(str(path), trust_remote_code=False, local_files_only=True)
        eos = set(extra_eos_ids)
        if self.tok.eos_token_id is not None:
            eos.add(self.tok.eos_token_id)
        self.eos_token_ids = sorted(eos)

    @property
    def vocab_size(self) -> int:
        return len(self.tok)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        if self.tok.chat_template is None:
            # A base model without a template: plain concatenation of the contents.
            return self.encode("\n".join(m["content"] for m in messages))
        out = self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(out, dict) or hasattr(out, "input_ids"):
            out = out["input_ids"]
        return list(out)

    def chat_prompt(self, prompt: str) -> list[int]:
        return self.apply_chat_template([{"role": "user", "content": prompt}])


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas without splitting
    multi-byte characters (a trailing U+FFFD waits for more tokens)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.emitted = ""

    def push(self, new_ids: list[int]) -> str:
        self.ids.extend(new_ids)
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd"):
            return ""
        delta = text[len(self.emitted):] if text.startswith(self.emitted) else ""
        self.emitted = text
        return delta
