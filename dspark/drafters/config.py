"""The configuration of a weighted drafter, in the public DSpark checkpoint's field names.

One dataclass covers DSpark, DFlash, Eagle3 and MTP-1. `config.json` of a drafter
checkpoint is `DrafterConfig.to_dict()`; `from_dict` also reads the public release's
layout (fields at the top level, or nested under `dflash_config`/`dspark_config`,
rope under `rope_parameters`).

Field meanings that are easy to get wrong:

* `block_size` counts the positions of one block INCLUDING the anchor, so a block
  drafter proposes at most `block_size - 1` tokens per round (Eagle3 uses the same
  field for its most drafted tokens; MTP-1 has `block_size = 2`).
* `target_layer_ids[i]` is the 0-based target decoder layer whose OUTPUT is tapped;
  -1 is the embedding output.
* `mask_token_id` is a token id of the TARGET vocabulary whose embedding fills the
  block positions after the anchor (see `default_mask_token_id`).
* The drafter's own layers are Llama-style for `model_type` llama, with q/k RMSNorm
  for qwen3 and q/k/v biases for qwen2 (the family of the target by default).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dspark.errors import UserError
from dspark.runtime.config import ModelConfig

METHODS = ("dspark", "dflash", "eagle3", "mtp")
#: what `--speculative-config` may name: the trained drafters and model-free n-gram lookup
SPECULATIVE_METHODS = (*METHODS, "ngram")
MARKOV_HEAD_TYPES = ("vanilla", "gated", "rnn")

# layer family (HF model_type) -> architecture prefix
FAMILIES = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3"}
_ARCH_SUFFIX = {"dspark": "DSparkModel", "dflash": "DFlashModel", "eagle3": "Eagle3Model", "mtp": "MTPModel"}
# Names used by other public releases for the same models (Qwen3-style layers).
_ARCH_ALIASES = {"DFlashDraftModel": ("dflash", "qwen3"), "DSparkDraftModel": ("dspark", "qwen3")}
# target model_type -> drafter layer family
_TARGET_FAMILY = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}

# Default sizes that are not copied from the target.
DEFAULT_NUM_LAYERS = {"dspark": 2, "dflash": 2, "eagle3": 1, "mtp": 1}
DEFAULT_NUM_TAPS = {"dspark": 5, "dflash": 5, "eagle3": 3}
DEFAULT_BLOCK_SIZE = {"dspark": 8, "dflash": 8, "eagle3": 8, "mtp": 2}


# Every field `DrafterConfig.to_dict` writes (and `from_dict` reads) at the top level.
CONFIG_JSON_FIELDS = frozenset({
    "architectures", "model_type", "hidden_act", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "rope_scaling",
    "rope_parameters", "max_position_embeddings", "attention_bias", "vocab_size", "tie_word_embeddings",
    "block_size", "target_layer_ids", "num_target_layers", "mask_token_id", "num_anchors", "markov_rank",
    "markov_head_type", "enable_confidence_head", "confidence_head_with_markov", "draft_vocab_size",
    "sample_from_anchor",
})


class DrafterConfigError(UserError, ValueError):
    """A drafter configuration that cannot be built (bad field value or combination)."""


def architecture_name(method: str, model_type: str) -> str:
    return FAMILIES[model_type] + _ARCH_SUFFIX[method]


def parse_architecture(name: str) -> tuple[str, str]:
    """`Qwen3DSparkModel` -> ("dspark", "qwen3")."""
    if name in _ARCH_ALIASES:
        return _ARCH_ALIASES[name]
    for model_type, prefix in FAMILIES.items():
        for method, suffix in _ARCH_SUFFIX.items():
            if name == prefix + suffix:
                return method, model_type
    known = sorted([architecture_name(m, f) for m in METHODS for f in FAMILIES] + list(_ARCH_ALIASES))
    raise DrafterConfigError(f"unknown drafter architecture {name!r}; known: {', '.join(known)}")


def spread_layer_ids(num_layers: int, count: int) -> list[int]:
    """`count` target layers spread evenly from low to high depth, skipping the first
    and the last two layers when the target is deep enough (30 layers, 3 taps ->
    [1, 14, 27])."""
    lo, hi = 1, num_layers - 3
    if hi - lo + 1 < count:
        lo, hi = 0, num_layers - 1
    if count == 1:
        return [hi]
    return [round(lo + i * (hi - lo) / (count - 1)) for i in range(count)]


def default_mask_token_id(vocab_size: int, tokenizer=None) -> int:
    """A target token id that normal text never produces, for the block's mask positions.

    * If the embedding matrix has padding rows past the tokenizer (Qwen3: 151936 rows,
      151669 tokens), the first padding row.
    * Else the last added special token that is not bos/eos/pad/unk and does not occur
      in the chat template. For SmolLM2 (the default target) this is 16,
      `<empty_output>`, a Jupyter-notebook marker that chat never emits.
    * Without a tokenizer, the last id of the vocabulary.
    """
    if tokenizer is None:
        return vocab_size - 1
    tok = getattr(tokenizer, "tok", tokenizer)
    n = len(tok)
    if n < vocab_size:
        return n
    reserved = {tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, tok.unk_token_id}
    template = tok.chat_template if isinstance(tok.chat_template, str) else ""
    added = getattr(tok, "added_tokens_decoder", {}) or {}
    for tid in sorted(added, reverse=True):
        t = added[tid]
        if getattr(t, "special", False) and tid not in reserved and tid < vocab_size and str(t) not in template:
            return int(tid)
    return vocab_size - 1


@dataclass
class DrafterConfig:
    method: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    target_layer_ids: list[int]
    num_target_layers: int
    head_dim: int = 0
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 4096
    attention_bias: bool = False
    block_size: int = 8
    mask_token_id: int | None = None
    num_anchors: int = 512  # training: anchors sampled per sequence
    # DSpark heads; None = the method's default (DSpark: rank 256, confidence on)
    markov_rank: int | None = None
    markov_head_type: str = "vanilla"
    enable_confidence_head: bool | None = None
    confidence_head_with_markov: bool = True
    # reduced draft vocabulary: the drafter's own LM head covers `draft_vocab_size`
    # target tokens (None = the full vocabulary, the target's LM head is shared); the
    # ids live in the `d2t` tensor of model.safetensors (draft index -> target id offset)
    draft_vocab_size: int | None = None
    # block convention: False = the block is [anchor, mask x (block_size - 1)] and the
    # slot at position P+k drafts token P+k (k >= 1); True (DeepSpec) = slot k drafts
    # token P+k+1, the anchor slot included, so a block drafts block_size tokens
    sample_from_anchor: bool = False
    extra: dict = field(default_factory=dict)  # unknown config.json fields, kept on save

    def __post_init__(self) -> None:
        m = self.method
        if m not in METHODS:
            raise DrafterConfigError(f"unknown drafter method {m!r}; choose one of {', '.join(METHODS)}")
        if self.model_type not in FAMILIES:
            raise DrafterConfigError(
                f"drafter layers of model_type {self.model_type!r} are not supported; choose one of {sorted(FAMILIES)}"
            )
        if self.head_dim == 0:
            self.head_dim = self.hidden_size // max(self.num_attention_heads, 1)
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim", "num_target_layers"):
            if int(getattr(self, name)) <= 0:
                raise DrafterConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise DrafterConfigError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        self.target_layer_ids = [int(i) for i in self.target_layer_ids]
        if not self.target_layer_ids:
            raise DrafterConfigError("target_layer_ids is empty: a drafter needs at least one tapped target layer")
        if m == "mtp":
            if self.block_size != 2:
                raise DrafterConfigError(f"MTP-1 drafts one token per round, so block_size must be 2, got {self.block_size}")
            if len(self.target_layer_ids) != 1:
                raise DrafterConfigError(f"MTP-1 taps exactly one target layer, got {self.target_layer_ids}")
        if self.block_size < 2:
            raise DrafterConfigError(f"block_size counts the anchor and must be >= 2, got {self.block_size}")
        if self.draft_vocab_size is not None:
            self.draft_vocab_size = int(self.draft_vocab_size)
            if not 1 <= self.draft_vocab_size <= self.vocab_size:
                raise DrafterConfigError(
                    f"draft_vocab_size must be in 1..vocab_size ({self.vocab_size}), got {self.draft_vocab_size}")
            if self.draft_vocab_size == self.vocab_size:
                self.draft_vocab_size = None
        self.sample_from_anchor = bool(self.sample_from_anchor)
        if self.sample_from_anchor and m not in ("dspark", "dflash"):
            raise DrafterConfigError(f"sample_from_anchor applies to block drafters (dspark, dflash), not {m}")
        if m == "eagle3" and self.num_hidden_layers != 1:
            raise DrafterConfigError(f"Eagle3 has exactly one decoder layer, got num_hidden_layers={self.num_hidden_layers}")
        if m in ("dspark", "dflash"):
            if self.mask_token_id is None:
                raise DrafterConfigError(f"{m} needs mask_token_id (a target token id for the block's mask positions)")
            if not 0 <= self.mask_token_id < self.vocab_size:
                raise DrafterConfigError(f"mask_token_id {self.mask_token_id} is outside the vocabulary of {self.vocab_size}")
        if m == "dspark":
            self.markov_rank = 256 if self.markov_rank is None else int(self.markov_rank)
            self.enable_confidence_head = True if self.enable_confidence_head is None else bool(self.enable_confidence_head)
            if self.markov_rank < 0:
                raise DrafterConfigError(f"markov_rank must be >= 0 (0 = no Markov head), got {self.markov_rank}")
            if self.markov_head_type not in MARKOV_HEAD_TYPES:
                raise DrafterConfigError(
                    f"unknown markov_head_type {self.markov_head_type!r}; choose one of {', '.join(MARKOV_HEAD_TYPES)}"
                )
            if self.enable_confidence_head and self.confidence_head_with_markov and self.markov_rank == 0:
                raise DrafterConfigError("confidence_head_with_markov needs a Markov head (markov_rank > 0)")
        else:
            if self.markov_rank or self.enable_confidence_head:
                raise DrafterConfigError(
                    f"{m} has no Markov or confidence head (markov_rank={self.markov_rank}, "
                    f"enable_confidence_head={self.enable_confidence_head}); use method 'dspark'"
                )
            self.markov_rank = 0
            self.enable_confidence_head = False

    # --- derived -----------------------------------------------------------------
    @property
    def architecture(self) -> str:
        if self.method == "dflash" and self.model_type == "qwen3":
            return "DFlashDraftModel"  # the name llama.cpp's converter and vLLM register
        return architecture_name(self.method, self.model_type)

    @property
    def max_draft_tokens(self) -> int:
        return self.block_size if self.sample_from_anchor else self.block_size - 1

    @property
    def first_draft_slot(self) -> int:
        """The block slot whose output drafts the first token (0 with sample_from_anchor)."""
        return 0 if self.sample_from_anchor else 1

    @property
    def reduced_vocab(self) -> bool:
        return self.draft_vocab_size is not None

    @property
    def output_vocab_size(self) -> int:
        """Rows of the drafter's LM head (and of the Markov head's output side)."""
        return self.draft_vocab_size or self.vocab_size

    @property
    def has_markov_head(self) -> bool:
        return self.method == "dspark" and bool(self.markov_rank)

    def layer_config(self) -> ModelConfig:
        """The drafter's own decoder layers as a runtime `ModelConfig` (for the KV pool
        and rope)."""
        return ModelConfig(
            model_type=self.model_type,
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_layers=self.num_hidden_layers,
            num_heads=self.num_attention_heads,
            num_kv_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta,
            rope_scaling=self.rope_scaling,
            max_position_embeddings=self.max_position_embeddings,
            qkv_bias=self.attention_bias or self.model_type == "qwen2",
            qk_norm=self.model_type == "qwen3",
        )

    def check_target(self, target: ModelConfig) -> list[str]:
        """Reasons this drafter cannot serve `target` (empty when it can)."""
        problems = []
        if self.vocab_size != target.vocab_size:
            problems.append(f"vocab_size {self.vocab_size} != the target's {target.vocab_size}")
        if self.hidden_size != target.hidden_size:
            problems.append(
                f"hidden_size {self.hidden_size} != the target's {target.hidden_size} "
                "(the drafter shares the target's embedding and LM head)"
            )
        bad = [i for i in self.target_layer_ids if not -1 <= i < target.num_layers]
        if bad:
            problems.append(
                f"target_layer_ids {bad} are out of range for a target of {target.num_layers} layers "
                f"(valid: -1..{target.num_layers - 1})"
            )
        if self.num_target_layers != target.num_layers:
            problems.append(f"num_target_layers {self.num_target_layers} != the target's {target.num_layers} layers")
        return problems

    # --- config.json -------------------------------------------------------------
    def to_dict(self) -> dict:
        rope = {"rope_type": "default", **(self.rope_scaling or {}), "rope_theta": self.rope_theta}
        out = {
            **self.extra,
            "architectures": [self.architecture],
            "model_type": self.model_type,
            "hidden_act": "silu",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_parameters": rope,
            "max_position_embeddings": self.max_position_embeddings,
            "attention_bias": self.attention_bias,
            "vocab_size": self.vocab_size,
            "tie_word_embeddings": False,
            "block_size": self.block_size,
            "target_layer_ids": list(self.target_layer_ids),
            "num_target_layers": self.num_target_layers,
        }
        if self.draft_vocab_size is not None:
            out["draft_vocab_size"] = self.draft_vocab_size
        if self.method in ("dspark", "dflash"):
            out["mask_token_id"] = self.mask_token_id
            out["num_anchors"] = self.num_anchors
            out["sample_from_anchor"] = self.sample_from_anchor
        if self.method == "dspark":
            out.update(
                markov_rank=self.markov_rank,
                markov_head_type=self.markov_head_type,
                enable_confidence_head=self.enable_confidence_head,
                confidence_head_with_markov=self.confidence_head_with_markov,
            )
        return out

    @classmethod
    def from_dict(cls, d: dict) -> "DrafterConfig":
        d = dict(d)
        for nested in ("dflash_config", "dspark_config"):
            for k, v in (d.get(nested) or {}).items():
                d.setdefault(k, v)
        archs = d.get("architectures") or []
        if not archs:
            raise DrafterConfigError("config.json has no 'architectures' (e.g. [\"Qwen3DSparkModel\"])")
        method, model_type = parse_architecture(archs[0])
        if d.get("use_sliding_window"):
            raise DrafterConfigError("sliding-window drafter attention is not supported")
        rope = d.get("rope_parameters") or {}
        theta = d.get("rope_theta", rope.get("rope_theta", 10000.0))
        scaling = d.get("rope_scaling") or (
            {k: v for k, v in rope.items() if k != "rope_theta"}
            if rope.get("rope_type", "default") != "default" else None
        )
        known = CONFIG_JSON_FIELDS | {"dflash_config", "dspark_config"}
        try:
            return cls(
                method=method,
                model_type=model_type,
                vocab_size=int(d["vocab_size"]),
                hidden_size=int(d["hidden_size"]),
                intermediate_size=int(d["intermediate_size"]),
                num_hidden_layers=int(d["num_hidden_layers"]),
                num_attention_heads=int(d["num_attention_heads"]),
                num_key_value_heads=int(d.get("num_key_value_heads") or d["num_attention_heads"]),
                head_dim=int(d.get("head_dim") or 0),
                rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
                rope_theta=float(theta),
                rope_scaling=scaling,
                max_position_embeddings=int(d.get("max_position_embeddings", 4096)),
                attention_bias=bool(d.get("attention_bias", False)),
                target_layer_ids=list(d["target_layer_ids"]),
                num_target_layers=int(d["num_target_layers"]),
                block_size=int(d.get("block_size", DEFAULT_BLOCK_SIZE[method])),
                mask_token_id=None if d.get("mask_token_id") is None else int(d["mask_token_id"]),
                num_anchors=int(d.get("num_anchors", 512)),
                markov_rank=d.get("markov_rank"),
                markov_head_type=str(d.get("markov_head_type", "vanilla")),
                enable_confidence_head=d.get("enable_confidence_head"),
                confidence_head_with_markov=bool(d.get("confidence_head_with_markov", True)),
                draft_vocab_size=d.get("draft_vocab_size"),
                sample_from_anchor=bool(d.get("sample_from_anchor", False)),
                extra={k: v for k, v in d.items() if k not in known},
            )
        except KeyError as e:
            raise DrafterConfigError(f"config.json lacks the field {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            if isinstance(e, DrafterConfigError):
                raise
            raise DrafterConfigError(f"config.json has a field of the wrong type: {e}") from None

    @classmethod
    def for_target(cls, method: str, target: ModelConfig, tokenizer=None, **overrides) -> "DrafterConfig":
        """A fresh config sized from the target: its layer geometry, rope and family,
        the method's default depth/taps/block, and `overrides` (any field)."""
        if method not in METHODS:
            raise DrafterConfigError(f"unknown drafter method {method!r}; choose one of {', '.join(METHODS)}")
        unknown = set(overrides) - set(cls.__dataclass_fields__)
        if unknown:
            raise DrafterConfigError(f"unknown drafter config fields {sorted(unknown)}")
        if "target_layer_ids" in overrides:
            taps = list(overrides.pop("target_layer_ids"))
        elif method == "mtp":
            taps = [target.num_layers - 1]
        else:
            taps = spread_layer_ids(target.num_layers, min(DEFAULT_NUM_TAPS[method], target.num_layers))
        # Block drafters use Qwen3-style layers (q/k RMSNorm) whatever the target's family:
        # the layout the engines that serve DSpark/DFlash drafts read.
        family = "qwen3" if method in ("dspark", "dflash") else _TARGET_FAMILY.get(target.model_type, "llama")
        fields = dict(
            method=method,
            model_type=family,
            vocab_size=target.vocab_size,
            hidden_size=target.hidden_size,
            intermediate_size=target.intermediate_size,
            num_hidden_layers=DEFAULT_NUM_LAYERS[method],
            num_attention_heads=target.num_heads,
            num_key_value_heads=target.num_kv_heads,
            head_dim=target.head_dim,
            rms_norm_eps=target.rms_norm_eps,
            rope_theta=target.rope_theta,
            rope_scaling=target.rope_scaling,
            max_position_embeddings=target.max_position_embeddings,
            attention_bias=family != "qwen3" and target.qkv_bias and target.model_type != "qwen2",
            target_layer_ids=taps,
            num_target_layers=target.num_layers,
            block_size=DEFAULT_BLOCK_SIZE[method],
        )
        if method in ("dspark", "dflash"):
            fields["mask_token_id"] = default_mask_token_id(target.vocab_size, tokenizer)
        fields.update(overrides)
        return cls(**fields)
