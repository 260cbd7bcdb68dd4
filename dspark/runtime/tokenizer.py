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
    """A request's output text, delivered as deltas and cut at the first stop string:
    the one detokenizer of the server and the CLI.

    A request finishes once a stop string appears in its text, with the tokens that
    completed it; the reader must never see the stop string. While it runs, the last
    `len(longest stop) - 1` characters are held back, since they may be the start of
    a stop string that the next tokens complete, and a trailing U+FFFD (half of a
    multi-byte character) waits for the next token. The deltas therefore always
    concatenate to the whole text (`text`)."""

    def __init__(self, tokenizer: Tokenizer, stop: list[str] | tuple[str, ...] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.holdback = max((len(s) for s in self.stop), default=1) - 1
        self.ids: list[int] = []
        self.sent = 0  # characters already delivered
        self.text = ""  # the text so far, cut at a stop string
        self.hit_stop = False

    def push(self, token_ids: list[int], finished: bool = False) -> str:
        """Add tokens; returns the text that may be shown now (all of it once `finished`)."""
        self.ids.extend(token_ids)
        text = self.tokenizer.decode(self.ids)
        cuts = [i for i in (text.find(s) for s in self.stop) if i >= 0]
        if cuts:
            text = text[: min(cuts)]
            self.hit_stop = True
        self.text = text
        if finished or self.hit_stop:
            ready = len(text)
        elif text.endswith("\ufffd"):
            return ""
        else:
            ready = len(text) - self.holdback
        if ready <= self.sent:
            return ""
        delta = text[self.sent: ready]
        self.sent = ready
        return delta
