"""Verification: which drafted tokens the target accepts (pure, no model inside)."""

from dspark.verify.rejection import VerifyResult, rejection_sample

__all__ = ["VerifyResult", "rejection_sample"]
