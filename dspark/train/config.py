"""`TrainConfig`: one recipe for every drafter method (see `dspark.train`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from dspark.drafters.config import METHODS
from dspark.errors import UserError

PRECISIONS = ("auto", "fp32", "bf16")


@dataclass
class TrainConfig:
    method: str
    data: list[str]
    out: str
    # drafter size (None = the method's default for the target)
    num_layers: int | None = None
    markov_rank: int | None = None
    block_size: int | None = None
    target_layer_ids: list[int] | None = None
    ttt_steps: int = 7  # Eagle3's unrolled training-time-test steps
    # optimisation
    epochs: float = 1.0
    max_steps: int | None = None  # overrides epochs
    batch_size: int = 8  # sequences per optimizer step, over all processes
    blocks_per_seq: int = 64  # anchors per sequence visit; an epoch trains every response position once
    draft_vocab_size: int | None = None  # reduced draft vocabulary (most frequent response tokens)
    sample_from_anchor: bool = False  # DeepSpec's block convention (block drafters)
    init: str = "random"  # "target": block drafter layers start as the target's last layers (train/init.py);
    # a directory: continue from that trained drafter (its sizes, taps and draft vocabulary)
    teacher_topk: int = 32  # p kept as its top-k
    position_decay: float = 4.0  # block position weights exp(-k/decay)
    round_start_weight: float = 0.0  # anchors where greedy decoding starts a round weigh 1 + this (heldout.py)
    lr: float = 6e-4
    min_lr_ratio: float = 0.1
    warmup_steps: int | None = None  # None = 4% of the steps
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    seed: int = 0
    precision: str = "auto"  # bf16 autocast on CUDA and bf16-capable CPUs (see placement.autocast_dtype)
    max_seq_len: int = 1024
    # output
    save_every: int = 200
    save_every_min: float | None = 10.0  # also checkpoint (and evaluate) on this wall-time interval
    log_every: int = 10
    eval_data: list[str] = field(default_factory=list)  # held-out responses: greedy acceptance at each checkpoint
    early_stop_evals: int = 0  # stop after this many evals without a better held-out tau (0 = never)
    save_dtype: str = "bf16"  # dtype of model.safetensors; fp32 masters live in trainer_state
    feature_cache: str | None = None  # directory of the hidden-state cache (None = on the fly)
    resume: bool = False
    time_limit_min: float | None = None  # stop early (saving the drafter) after this many minutes
    progress: bool = True
    extra_sizes: dict = field(default_factory=dict)  # any other DrafterConfig field

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise UserError(f"--method must be one of {', '.join(METHODS)}, got {self.method!r}")
        if not self.data:
            raise UserError("give at least one --data FILE.jsonl (see `dspark data generate`)")
        checks = {"batch_size": 1, "blocks_per_seq": 1, "ttt_steps": 1, "save_every": 1, "log_every": 1,
                  "max_seq_len": 8, "teacher_topk": 1, "early_stop_evals": 0}
        for name, lo in checks.items():
            if getattr(self, name) < lo:
                raise UserError(f"--{name.replace('_', '-')} must be >= {lo}, got {getattr(self, name)}")
        if self.max_steps is not None and self.max_steps < 1:
            raise UserError(f"--max-steps must be >= 1, got {self.max_steps}")
        if self.draft_vocab_size is not None and self.draft_vocab_size < 2:
            raise UserError(f"--draft-vocab-size must be >= 2, got {self.draft_vocab_size}")
        if not self.position_decay > 0:
            raise UserError(f"--position-decay must be > 0, got {self.position_decay}")
        if not self.round_start_weight >= 0:
            raise UserError(f"--round-start-weight must be >= 0, got {self.round_start_weight}")
        if self.save_every_min is not None and self.save_every_min <= 0:
            raise UserError(f"--save-every-min must be > 0, got {self.save_every_min}")
        if self.epochs <= 0:
            raise UserError(f"--epochs must be > 0, got {self.epochs}")
        if not self.lr > 0 or not 0 <= self.min_lr_ratio <= 1:
            raise UserError("--lr must be > 0 and the minimum-lr ratio in [0, 1]")
        if self.time_limit_min is not None and self.time_limit_min <= 0:
            raise UserError(f"--time-limit-min must be > 0, got {self.time_limit_min}")
        if self.init not in ("random", "target") and not Path(self.init).is_dir():
            raise UserError(f"--init must be random, target or a trained drafter's directory, got {self.init!r}")
        if self.init == "target" and self.method not in ("dspark", "dflash"):
            raise UserError(f"--init target applies to dspark and dflash, not {self.method}")
        if self.precision not in PRECISIONS:
            raise UserError(f"--precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.save_dtype not in ("bf16", "fp32"):
            raise UserError(f"--save-dtype must be bf16 or fp32, got {self.save_dtype!r}")
        if self.method == "mtp" and self.block_size not in (None, 2):
            raise UserError("mtp drafts one token per round; leave --block-size out (it is 2)")
        if self.sample_from_anchor and self.method not in ("dspark", "dflash"):
            raise UserError(f"--sample-from-anchor applies to dspark and dflash, not {self.method}")
        if self.method != "dspark" and self.markov_rank:
            raise UserError(f"--markov-rank applies to dspark only, not {self.method}")

    def drafter_sizes(self) -> dict:
        """DrafterConfig overrides for `create_drafter`."""
        sizes = dict(self.extra_sizes)
        if self.num_layers is not None:
            sizes["num_hidden_layers"] = self.num_layers
        if self.markov_rank is not None:
            sizes["markov_rank"] = self.markov_rank
        if self.block_size is not None:
            sizes["block_size"] = self.block_size
        elif self.method == "eagle3":
            sizes["block_size"] = self.ttt_steps + 1
        if self.target_layer_ids is not None:
            sizes["target_layer_ids"] = list(self.target_layer_ids)
        if self.sample_from_anchor:
            sizes["sample_from_anchor"] = True
        return sizes

    def to_dict(self) -> dict:
        return asdict(self)
