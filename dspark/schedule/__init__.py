"""Verification-length scheduling: survival probabilities and a measured step-time
table in, the number of drafted tokens to verify per request out.

Pure: no model, no engine state beyond the async policy's history of survivals.
"""

from .policies import (
    POLICY_NAMES,
    ConfidenceThreshold,
    DSparkAsync,
    DSparkSync,
    FixedLength,
    NoSpeculation,
    VerifyLengthPolicy,
    as_survival,
    make_policy,
)
from .step_time import DrafterTimeTable, ScheduleError, StepTimeTable, isotonic, make_monotone, spikes

__all__ = [
    "POLICY_NAMES",
    "ConfidenceThreshold",
    "DSparkAsync",
    "DSparkSync",
    "DrafterTimeTable",
    "FixedLength",
    "NoSpeculation",
    "ScheduleError",
    "StepTimeTable",
    "VerifyLengthPolicy",
    "as_survival",
    "isotonic",
    "make_monotone",
    "make_policy",
    "spikes",
]
