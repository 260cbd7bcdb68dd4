"""`TrainConfig`: one recipe for every drafter method (see `dspark.train`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from dspark.drafters.config import DEFAULT_NUM_TAPS, METHODS, spread_layer_ids
from dspark.errors import UserError

PRECISIONS = ("auto", "fp32", "bf16")

#: The recipe the shipped drafters were trained with (scripts/train/shipped.sh; their
#: numbers in dspark/drafters/shipped/README.md): what `dspark train --method M` trains
#: when a flag is left out. The sizes apply to a new drafter (--init random or target);
#: --init DIR keeps that drafter's.
SHIPPED_SIZES: dict[str, dict] = {
    "dspark": {"block_size": 7, "sample_from_anchor": True, "markov_rank": 64},
    "dflash": {"block_size": 8, "sample_from_anchor": False},
    "eagle3": {},
    "mtp": {},
}
#: anchors per sequence visit: the block drafters train a block per anchor, the
#: token-at-a-time ones a few positions, so they take more anchors for the same work
SHIPPED_BLOCKS_PER_SEQ = {"dspark": 64, "dflash": 64, "eagle3": 256, "mtp": 256}
#: the draft vocabulary: 8,192 tokens covered 100 % of the default model's training
#: replies and 88.5 % of a second target's held-out ones (docs/train-a-drafter.md)
SHIPPED_DRAFT_VOCAB = 8192


def shipped_taps(num_layers: int) -> list[int]:
    """The shipped DSpark drafter's taps for a target of `num_layers` layers: the five
    spread ones and the second-to-last layer (30 layers: 1, 8, 14, 20, 27, 28). The
    shipped drafter moved that tap off the last layer, which llama.cpp's draft-dspark
    cannot read (dspark/drafters/shipped/README.md)."""
    taps = spread_layer_ids(num_layers, min(DEFAULT_NUM_TAPS["dspark"], num_layers))
    return taps if num_layers < 3 or num_layers - 2 in taps else sorted(taps + [num_layers - 2])


@dataclass
class TrainConfig:
    method: str
    data: list[str]
    out: str
    # drafter size (None = the shipped recipe's for the method, SHIPPED_SIZES, or the
    # drafter's own default for the target)
    num_layers: int | None = None
    markov_rank: int | None = None
    block_size: int | None = None
    target_layer_ids: list[int] | None = None  # None: dspark shipped_taps, else the drafter's default
    ttt_steps: int = 7  # Eagle3's unrolled training-time-test steps
    # optimisation
    epochs: float = 1.0
    max_steps: int | None = None  # overrides epochs
    batch_size: int = 4  # sequences per optimizer step, over all processes
    # anchors per sequence visit (None: SHIPPED_BLOCKS_PER_SEQ); an epoch trains every
    # response position once
    blocks_per_seq: int | None = None
    # reduced draft vocabulary (most frequent response tokens); None: SHIPPED_DRAFT_VOCAB
    # where the target's is larger; 0: the target's whole vocabulary
    draft_vocab_size: int | None = None
    sample_from_anchor: bool | None = None  # DeepSpec's block convention (block drafters); None: SHIPPED_SIZES
    init: str = "random"  # "target": block drafter layers start as the target's last layers (train/init.py);
    # a directory: continue from that trained drafter (its sizes, taps and draft vocabulary)
    teacher_topk: int = 32  # p kept as its top-k
    position_decay: float = 2.0  # block position weights exp(-k/decay) (the paper's: 4)
    round_start_weight: float = 0.0  # anchors where greedy decoding starts a round weigh 1 + this (heldout.py)
    lookup_miss_weight: float = 0.0  # anchors where prompt lookup misses weigh 1 + this (lookup_misses.py)
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
        if self.blocks_per_seq is None:
            self.blocks_per_seq = SHIPPED_BLOCKS_PER_SEQ[self.method]
        if self.init in ("random", "target"):  # a new drafter: the shipped recipe where a size is left out
            for name, value in SHIPPED_SIZES[self.method].items():
                if getattr(self, name) is None:
                    setattr(self, name, value)
        checks = {"batch_size": 1, "blocks_per_seq": 1, "ttt_steps": 1, "save_every": 1, "log_every": 1,
                  "max_seq_len": 8, "teacher_topk": 1, "early_stop_evals": 0}
        for name, lo in checks.items():
            if getattr(self, name) < lo:
                raise UserError(f"--{name.replace('_', '-')} must be >= {lo}, got {getattr(self, name)}")
        if self.max_steps is not None and self.max_steps < 1:
            raise UserError(f"--max-steps must be >= 1, got {self.max_steps}")
        if self.draft_vocab_size is not None and self.draft_vocab_size != 0 and self.draft_vocab_size < 2:
            raise UserError(f"--draft-vocab-size must be >= 2 (or 0, the whole vocabulary), got {self.draft_vocab_size}")
        if not self.position_decay > 0:
            raise UserError(f"--position-decay must be > 0, got {self.position_decay}")
        if not self.round_start_weight >= 0:
            raise UserError(f"--round-start-weight must be >= 0, got {self.round_start_weight}")
        if not self.lookup_miss_weight >= 0:
            raise UserError(f"--lookup-miss-weight must be >= 0, got {self.lookup_miss_weight}")
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

    def for_target(self, num_layers: int, vocab_size: int) -> TrainConfig:
        """This config with the recipe's choices that depend on the target made: a new
        DSpark drafter's taps (`shipped_taps`) and the draft vocabulary's size (0 where
        the target's is no larger than the recipe's)."""
        fresh = self.init in ("random", "target")
        taps = self.target_layer_ids
        if taps is None and fresh and self.method == "dspark":
            taps = shipped_taps(num_layers)
        vocab = self.draft_vocab_size
        if vocab is None:
            vocab = SHIPPED_DRAFT_VOCAB if fresh and vocab_size > SHIPPED_DRAFT_VOCAB else 0
        return replace(self, target_layer_ids=taps, draft_vocab_size=vocab)

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
