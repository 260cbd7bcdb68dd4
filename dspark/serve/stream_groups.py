"""Streamed tokens in fixed groups (`--stream-chunk-tokens N`).

Each engine step emits a request's accepted drafts plus one token of the target's
own, and a stream that sends one chunk a step shows that count to anyone who reads
the chunk sizes: which of a reply's tokens were drafted, and so (with lookup) which
of them some earlier text held, without any clock. Grouping sends N tokens a chunk
whatever the steps were, at the cost of holding the first chunk until N tokens
exist (the time to first token grows by about N - 1 tokens' decoding at worst).
"""

from __future__ import annotations


class TokenGroups:
    """Cuts a request's emitted tokens into the chunks to send."""

    def __init__(self, size: int) -> None:
        if size < 0:
            raise ValueError(f"a group size must be >= 0 (0: as emitted), got {size}")
        self.size = size
        self._pending: list[int] = []

    def push(self, token_ids: list[int], finished: bool) -> list[list[int]]:
        """The chunks to send now for one step's `token_ids`: as they came without
        grouping; else every full group, and, once `finished`, the rest (possibly empty)
        as the last chunk. A finished request always gets a last chunk."""
        if not self.size:
            return [token_ids] if token_ids or finished else []
        pending = self._pending
        pending.extend(token_ids)
        full = len(pending) - len(pending) % self.size
        out = [pending[i: i + self.size] for i in range(0, full, self.size)]
        self._pending = pending[full:]
        if finished:
            out.append(self._pending)
            self._pending = []
        return out
