"""Per-request early exit from drafting: requests the scheduler keeps verifying
nothing for stop running the drafter's block, and are probed now and then.

The policy chooses each request's verification length from its survivals; when that
length has been 0 on the request's last `patience` drafted steps, drafting it again
is (by the scheduler's own estimate) pure cost. The gate then leaves the request out
of the drafter's batch and lets it back in for one probe step after `probe_gap`
steps, doubling the gap after each probe that verifies nothing again (up to
`max_gap`), and resetting it after one that verifies something.

Lossless: whether a request is drafted this step depends only on earlier steps'
choices, never on this step's drafts, and an undrafted request simply verifies 0
tokens (plain decoding for that row).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class _GateState:
    zero_streak: int = 0  # consecutive drafted steps that verified nothing
    wait: int = 0  # steps left before the next probe (0 = drafted normally)
    gap: int = 0  # the current probe gap


class DraftGate:
    def __init__(self, patience: int = 3, probe_gap: int = 4, max_gap: int = 32) -> None:
        if patience < 1 or probe_gap < 1 or max_gap < probe_gap:
            raise ValueError("DraftGate needs patience >= 1 and 1 <= probe_gap <= max_gap")
        self.patience = patience
        self.probe_gap = probe_gap
        self.max_gap = max_gap
        self._state: dict[object, _GateState] = {}
        #: request-steps left out of drafting so far (a metric)
        self.skipped = 0

    def wants_draft(self, request_id: object) -> bool:
        """Whether to draft this request in the current step (call once per step)."""
        st = self._state.get(request_id)
        if st is None or st.wait == 0:
            return True
        st.wait -= 1
        if st.wait == 0:
            return True  # the probe
        self.skipped += 1
        return False

    def record(self, request_id: object, verify_len: int) -> None:
        """The length the policy chose for a drafted request."""
        st = self._state.setdefault(request_id, _GateState())
        if verify_len > 0:
            st.zero_streak, st.gap, st.wait = 0, 0, 0
            return
        st.zero_streak += 1
        if st.zero_streak >= self.patience:
            st.gap = self.probe_gap if st.gap == 0 else min(2 * st.gap, self.max_gap)
            st.wait = st.gap

    def release(self, request_id: object) -> None:
        self._state.pop(request_id, None)
