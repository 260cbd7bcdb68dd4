"""The named speculative configurations, defined once: what `dspark serve
--speculative-config`'s default is, and the names the benchmarks compare
(`dspark bench engine --configs`, `dspark bench sweep --configs`).

Each is a `--speculative-config` JSON object (None: plain decoding). A leaf of plain
data, so the engine (which builds from them) and the load generator (which only
passes them to a server) both read them without importing each other.
"""

from __future__ import annotations

#: the engine's default (`dspark.engine.config.DEFAULT_SPECULATIVE`, where its
#: measurements are quoted): hybrid drafting (DSpark + prompt lookup, in the prompt and
#: in earlier replies) with adaptive verification, and the plain-decoding fallback
#: from 8 running requests, with trials from 2
DEFAULT = {"method": "dspark", "enable_adaptive_verification": True, "lookup": True,
           "plain_fallback": 8, "plain_trials_from": 2, "lookup_history": True}

#: the default for a target without a shipped drafter (`LOOKUP_DEFAULT`): prompt lookup
#: alone, lengths priced by the scheduler, governed from two requests
LOOKUP_DEFAULT = {"method": "ngram", "enable_adaptive_verification": True, "plain_fallback": 2}

PRESETS: dict[str, dict | None] = {
    "plain": None,  # no speculation
    "default": DEFAULT,
    # DSpark and prompt lookup with adaptive verification, never governed, no reply history
    "hybrid": {"method": "dspark", "enable_adaptive_verification": True, "lookup": True},
    # the default's drafter alone: no prompt lookup, scheduled and governed as in the default
    "dspark": {**DEFAULT, "lookup": False, "lookup_history": False},
    # prompt lookup alone with fixed verification: needs no drafter (any model)
    "lookup": {"method": "ngram"},
    # prompt lookup with calibrated confidences, each request's length priced on the step time
    "lookup-priced": {"method": "ngram", "enable_adaptive_verification": True},
    "lookup-default": LOOKUP_DEFAULT,
}
