"""A request's output text, delivered as deltas and cut at the first stop string.

The engine finishes a request once a stop string appears in its text but emits
the tokens that completed it; the client must never see the stop string. While a
request runs, the last `len(longest stop) - 1` characters are held back, since
they may be the start of a stop string that the next tokens complete, and a
trailing U+FFFD (half of a multi-byte character) waits for the next token.
Streamed deltas therefore always concatenate to the non-streamed text.
"""

from __future__ import annotations

from dspark.runtime.tokenizer import Tokenizer


class OutputText:
    def __init__(self, tokenizer: Tokenizer, stop: list[str]) -> None:
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.holdback = max((len(s) for s in self.stop), default=1) - 1
        self.ids: list[int] = []
        self.sent = 0  # characters already delivered
        self.text = ""  # the text so far, cut at a stop string
        self.hit_stop = False

    def push(self, token_ids: list[int], finished: bool) -> str:
        """Add tokens; returns the text that may be shown now."""
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
