"""Drafters: propose tokens for the target to verify.

`base` holds the contract the speculative loop talks to. Weighted drafters (DSpark,
DFlash, Eagle3, MTP-1) share the target's embedding and LM head and one decoder-layer
implementation (`layers`); `ngram` needs no weights. `create_drafter` builds a fresh
one, `load_drafter`/`save_drafter` read and write checkpoint directories
(`load_drafter` also reads other engines' layouts, `export_drafter` writes them).
"""

from .autoregressive import Eagle3Drafter, MTPDrafter
from .base import DraftOutput, DraftRequest, Drafter
from .checkpoint import DrafterCheckpointError, load_drafter, save_drafter
from .config import DrafterConfig, DrafterConfigError
from .dspark import DSparkDrafter
from .factory import create_drafter
from .export import export_drafter
from .ngram import NgramDrafter

__all__ = [
    "DSparkDrafter",
    "DraftOutput",
    "DraftRequest",
    "Drafter",
    "DrafterCheckpointError",
    "DrafterConfig",
    "DrafterConfigError",
    "Eagle3Drafter",
    "MTPDrafter",
    "NgramDrafter",
    "create_drafter",
    "export_drafter",
    "load_drafter",
    "save_drafter",
]
