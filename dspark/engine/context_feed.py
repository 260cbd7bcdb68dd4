"""Accepted tokens and their tapped hidden states on their way to the drafter.

The drafter is fed only right before it drafts, so that a step that skips drafting
costs what a plain step costs: each step's accepted tokens and hidden states wait in
a per-request backlog, and reach the drafter in one batched call when it drafts for
that request again (or when the backlog reaches PENDING_FLUSH tokens, which bounds
the memory a long stretch without drafting holds). A request whose context the
drafter cannot take is marked undrafted for the rest of its life.

While the engine decodes plain by the plain-decoding fallback's call (speculation does
not pay at this load), the requests of those steps go on without the drafter
(`let_go`, `contextless`: prompt lookup still serves them, which needs no drafter
context), and the steps tap no hidden states at all, so that they cost what plain
decoding's steps cost. Keeping the taps for a later catch-up spent, per plain-mode
step of 16 requests, the taps' 3 % of the target's forward and their bookkeeping, and
feeding the backlog a drafter pass on every token of every request at exactly the load
where nothing drafts (docs/journal.md). `feeding()` false also drops any
backlog that reaches PENDING_FLUSH on the way; so does a stretch of hybrid drafting with
its drafter off (lookup alone, by the engine's drafter_or_lookup): feeding such a backlog
is a drafter pass over PENDING_FLUSH tokens for a drafter that may not run again.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dspark.drafters.base import Drafter

#: a request's backlog of undrafted context (tokens) at which it is fed to the drafter
#: anyway, which bounds the memory a long stretch without drafting holds
PENDING_FLUSH = 256


class ContextFeed:
    def __init__(self, drafter: Drafter, device: torch.device, undrafted: set, fault: Callable[[str], None],
                 contextless: set | None = None, feeding: Callable[[], bool] = lambda: True) -> None:
        self.drafter = drafter
        self.device = device
        self.undrafted = undrafted  # shared with the runner
        self.fault = fault
        #: requests whose backlog was dropped (no drafter from then on; shared with the runner)
        self.contextless = contextless if contextless is not None else set()
        self.feeding = feeding
        #: per request: (start position, tokens, hidden [n, taps, H]) in order, not fed yet
        self.pending: dict[object, list[tuple[int, list[int], torch.Tensor | None]]] = {}
        self.pending_tokens: dict[object, int] = {}  # tokens in each backlog

    def drop(self, request_id: object) -> None:
        self.pending.pop(request_id, None)
        self.pending_tokens.pop(request_id, None)

    def let_go(self, ids: list) -> None:
        """These requests go on without the drafter (`contextless`): their backlog is
        dropped and no more context is kept for them; prompt lookup still serves them."""
        for rid in ids:
            self.drop(rid)
            self.contextless.add(rid)

    def stash(self, ids: list, tokens: list[list[int]], starts: list[int], rows: list[int],
               hidden: torch.Tensor | None) -> None:
        """Keep the accepted tokens and their tapped hidden states for the drafter's next
        draft (each request keeps a view of the step's taps: its rows are consecutive);
        a request whose backlog reaches PENDING_FLUSH tokens is fed at once."""
        keep = [j for j, rid in enumerate(ids) if rid not in self.undrafted and rid not in self.contextless]
        if not keep:
            return
        offsets, at = [], 0
        for t in tokens:
            offsets.append(at)
            at += len(t)
        full = []
        for j in keep:
            rid, toks = ids[j], tokens[j]
            n = len(toks)
            h = None
            if hidden is not None:
                mine = rows[offsets[j]: offsets[j] + n]
                if n and mine[-1] - mine[0] == n - 1:  # a request's rows are consecutive: a view
                    h = hidden[mine[0]: mine[0] + n]
                else:
                    h = hidden.index_select(0, torch.tensor(mine, dtype=torch.long, device=self.device))
            backlog = self.pending.setdefault(rid, [])
            backlog.append((starts[j], toks, h))
            size = self.pending_tokens.get(rid, 0) + n
            self.pending_tokens[rid] = size
            if size >= PENDING_FLUSH:
                full.append(rid)
        if full and not self.feeding():
            self.let_go(full)  # plain decoding by the fallback's call
            return
        if full:
            self.flush(full)

    def flush(self, ids: list) -> None:
        """Hand the backlog of these requests to the drafter in one call."""
        todo = [rid for rid in ids if self.pending.get(rid)]
        if not todo:
            return
        starts, tokens, hiddens = [], [], []
        for rid in todo:
            backlog = self.pending.pop(rid)
            self.pending_tokens.pop(rid, None)
            starts.append(backlog[0][0])
            tokens.append([t for _, toks, _ in backlog for t in toks])
            hiddens.extend(h for _, _, h in backlog)
        hidden = None if any(h is None for h in hiddens) else torch.cat(hiddens)
        rows = list(range(sum(len(t) for t in tokens)))
        self._feed(todo, tokens, starts, rows, hidden)

    def _feed(self, ids: list, tokens: list[list[int]], starts: list[int], rows: list[int],
                      hidden: torch.Tensor | None) -> None:
        """Hand accepted tokens (and their hidden states) to the drafter; when the batched
        call fails, each request alone, and those that still fail are left undrafted."""
        keep = [i for i, rid in enumerate(ids) if rid not in self.undrafted]
        bounds, at = [], 0
        for t in tokens:
            bounds.append((at, at + len(t)))
            at += len(t)

        def feed(idx: list[int]) -> None:
            take = [r for i in idx for r in range(*bounds[i])]
            h = hidden.index_select(0, torch.tensor([rows[r] for r in take], device=self.device)) \
                if hidden is not None else None
            self.drafter.append_context([ids[i] for i in idx], [tokens[i] for i in idx], [starts[i] for i in idx], h)

        if not keep:
            return
        try:
            feed(keep)
            return
        except Exception:
            self.fault("append_context")
        for i in keep:
            try:
                feed([i])
            except Exception:
                self.undrafted.add(ids[i])
