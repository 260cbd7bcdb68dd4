"""The engine's configuration, in one place: `EngineConfig` (batching and memory)
and `SpeculativeConfig` (what `--speculative-config` carries, with vLLM's key names),
and the one meaning of a missing `--speculative-config`. Building the drafter a config
names lives with the drafters (`dspark.drafters.build`).

Method names belong to `dspark.drafters` (SPECULATIVE_METHODS), policy names to
`dspark.schedule` (POLICY_NAMES); each default is stated once, here, and the CLI's
flags take theirs from these dataclasses (importing this module loads no torch).

Speculative-decoding configuration (vLLM's key names) and the one-prompt entry point.

`SpeculativeConfig.from_dict` accepts what `--speculative-config` carries:
`method` (dspark, dflash, eagle3, mtp, ngram), `model` (drafter checkpoint directory;
omitted = the drafter shipped for the default target; "random" = a freshly
initialised drafter, useful only for testing exactness), `num_speculative_tokens`,
`enable_adaptive_verification` (true selects the dspark-async policy), and dspark's
own keys `verification_policy`, `confidence_threshold`, `async_lag`,
`draft_probe_every` (dspark-async: skip the drafter while it does not pay, drafting
every N-th such step anyway; 0 never skips), `markov_candidates` (dspark: the Markov
head biases the backbone's top-N tokens per position; 0 = the full vocabulary),
`prompt_lookup_max`, `prompt_lookup_min` (ngram, and hybrid lookup), and `lookup`
(dspark: hybrid drafting, prompt lookup and the DSpark block in one block, per
position the proposal with the higher calibrated confidence; `lookup_calibration`
names a table fitted by `dspark calibrate-lookup`, default the shipped one; ngram
with a confidence policy (`enable_adaptive_verification`, `dspark-sync`, `threshold`)
is priced lookup: calibrated confidences, each request's length chosen on the target's
step time, dspark/drafters/priced_lookup.py;
`drafter_trust` (hybrid, default true): the drafter's confidences scaled per request
by how its drafted tokens fared, see dspark/drafters/hybrid.py; `lookup_history`
(calibrated lookup; false unless given, true in the default configuration): look up in
the engine's earlier replies too, dspark/drafters/reply_history.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

from dspark.errors import UserError
from dspark.presets import PRESETS


@dataclass
class EngineConfig:
    max_num_seqs: int = 32
    max_model_len: int = 2048
    max_waiting: int = 1024
    #: prompt tokens per step: a longer prompt is prefilled in chunks over several
    #: steps, so that running requests keep decoding meanwhile
    max_prefill_tokens: int = 512
    #: keep recent prompts' keys and values and reuse them for prompts that begin the
    #: same way (dspark.engine.prefix_cache); only in batch-invariant CPU precisions
    prefix_caching: bool = True

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_model_len", "max_waiting", "max_prefill_tokens"):
            if getattr(self, name) < 1:
                raise UserError(f"{name} must be positive, got {getattr(self, name)}")


SHIPPED_DIR = Path(__file__).parent.parent / "drafters" / "shipped"


#: what a missing --speculative-config means in every command: the DSpark drafter
#: shipped for the target, with adaptive verification; a target without one runs
#: `LOOKUP_DEFAULT` (with a warning). 'none' turns speculation off.
#: hybrid drafting (DSpark + prompt lookup) with adaptive verification, and the
#: plain-decoding fallback from 8 running requests, with trials from 2 (a level starts
#: plain where the step-time curve says verification is dear; dspark.engine.load_governor).
#: Served, interleaved: on a 2-core AMX Xeon in bf16x (fallback from 8 only) 1.39-1.50x
#: plain decoding at one request, 1.13x at four, 0.95-1.00x at sixteen, 0.94-0.98x at 32
#: (docs/journal.md); on a 2-core AVX2-only EPYC 0.94x / 0.99x / 1.10x at
#: 4 / 16 / 32 (docs/journal.md, "Steps that speculate nothing ..."); with
#: the governor's decayed scores and margin, 1.20x at one request (before it) and 1.01x /
#: 0.95x / 1.03x at 4 / 16 / 32 (docs/journal.md); engine alone, stepped in
#: turn with plain decoding, 1.19x / 0.966x / 0.984x / 0.997x at 1 / 4 / 16 / 32
#: Lookup in earlier replies too (`lookup_history`): engine alone on the AMX Xeon, 1.055x
#: the default without it at one request with 1,000 earlier replies held, 1.075x with
#: none held at start (48 requests filling it), 1.078x at four, 1.014x at sixteen and
#: 1.003x at 32 (docs/journal.md).
DEFAULT_SPECULATIVE = PRESETS["default"]

#: the default for a target without a shipped drafter: prompt lookup alone (no drafter),
#: each request's length priced by the scheduler (calibrated lookup survivals against
#: the step-time curve: dspark.drafters.priced_lookup), ungoverned at one request,
#: governed from two (those levels start plain and try speculation now and then;
#: dspark.engine.load_governor), since there a step of several tokens per request is dear and
#: lookup's tokens are accepted too rarely. Engine alone, stepped in turn with plain
#: decoding (2-core AVX2 EPYC, bf16w), against the earlier fixed 3 tokens: at one request
#: 1.184x against 1.165x plain on the second target (Qwen2.5-Coder-0.5B) and 1.127x against
#: 1.095x on the default model; at 4 requests 0.999x against 0.995x and 0.987x against
#: 0.978x; at 16, level with plain decoding both (docs/journal.md). Its
#: one cost: the step-time profile on a target's first use, at one request too (28-33 s
#: for the second target; cached after). Since it reuses kept prompts (the prefix cache),
#: 1.24x plain at one request on the default model and 1.28x on the second target
#: (requests of 48-144 tokens).
LOOKUP_DEFAULT = PRESETS["lookup-default"]

#: how a learned drafter's linears may be stored (SpeculativeConfig.drafter_weights)
DRAFTER_WEIGHTS = ("bf16", "q8_0", "q4_0")

#: the verification policies that read the drafts' confidences
CONFIDENCE_POLICIES = ("threshold", "dspark-sync", "dspark-async")


@dataclass
class SpeculativeConfig:
    method: str = "dspark"
    model: str | None = None
    num_speculative_tokens: int | None = None
    enable_adaptive_verification: bool = False
    verification_policy: str | None = None
    confidence_threshold: float = 0.5
    async_lag: int = 2
    draft_probe_every: int = 8
    markov_candidates: int | None = None  # None: the drafter's default (64)
    prompt_lookup_max: int = 3
    prompt_lookup_min: int = 1
    lookup: bool = False
    lookup_calibration: str | None = None
    #: calibrated lookup (hybrid or priced ngram): where a request's own tokens have no
    #: 3-gram match, look up in the engine's earlier replies too
    #: (dspark.drafters.reply_history; a timing side channel between users; on in
    #: DEFAULT_SPECULATIVE)
    lookup_history: bool = False
    #: hybrid: the drafter's confidences as each request earns them (false: as the
    #: confidence head gives them)
    drafter_trust: bool = True
    #: the scheduler's step-time table corrected by the engine's own measured steps
    #: (dspark.schedule.live); false keeps the profile as measured at start-up
    live_step_time: bool = True
    #: turn speculation off for stretches where it measures slower than plain decoding
    #: (dspark.engine.load_governor); on a CPU only, with any verification (prompt lookup's
    #: fixed one too: the engine then measures the step-time table it scores with). false: never;
    #: true: at every load, starting with speculation; an integer N: for steps of N or
    #: more decoding requests (their power-of-two level and above), starting with plain
    #: decoding (the default configuration uses 8)
    plain_fallback: bool | int = False
    #: with plain_fallback N: the load levels from this many decoding requests up to
    #: N's are governed too, each starting with speculation (None: not governed)
    plain_trials_from: int | None = None
    #: how a learned drafter's linears are stored on a CPU: "bf16" (the target's bf16
    #: kernel: bf16w or bf16x) or a GGUF block type quantized at load, "q8_0" or "q4_0"
    #: (the q8x kernel, int8 activations); the drafter's own output only, never the target's
    drafter_weights: str = "bf16"

    def __post_init__(self) -> None:
        # the names are drafters' and schedule's (imported here: this module stays
        # light, so that the CLI can read its defaults without loading torch)
        from dspark.drafters.config import SPECULATIVE_METHODS
        from dspark.schedule.policies import POLICY_NAMES

        if self.method not in SPECULATIVE_METHODS:
            raise UserError(f"unknown speculative method {self.method!r}; choose one of {', '.join(SPECULATIVE_METHODS)}")
        n = self.num_speculative_tokens
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 64):
            raise UserError(f"num_speculative_tokens must be an integer in 1..64, got {n!r}")
        if self.verification_policy is not None and self.verification_policy not in POLICY_NAMES:
            raise UserError(f"unknown verification_policy {self.verification_policy!r}; choose one of {', '.join(POLICY_NAMES)}")
        _check_non_negative_int("draft_probe_every", self.draft_probe_every)
        for name in ("prompt_lookup_min", "prompt_lookup_max"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise UserError(f"{name} must be an n-gram length >= 1, got {v!r}")
        if self.prompt_lookup_max < self.prompt_lookup_min:
            raise UserError(f"prompt_lookup_max ({self.prompt_lookup_max}) is below prompt_lookup_min "
                            f"({self.prompt_lookup_min})")
        if self.markov_candidates is not None:
            _check_non_negative_int("markov_candidates", self.markov_candidates, " (0 = full vocabulary)")
            if self.method != "dspark":
                raise UserError(f"markov_candidates applies to the dspark method's Markov head, not {self.method!r}")
        if not isinstance(self.lookup, bool):
            raise UserError(f"lookup must be true or false, got {self.lookup!r}")
        if not isinstance(self.live_step_time, bool):
            raise UserError(f"live_step_time must be true or false, got {self.live_step_time!r}")
        pf = self.plain_fallback
        if not isinstance(pf, (bool, int)) or (not isinstance(pf, bool) and pf < 1):
            raise UserError(f"plain_fallback must be true, false or a number of requests >= 1, got {pf!r}")
        pt = self.plain_trials_from
        if pt is not None and (isinstance(pt, bool) or not isinstance(pt, int) or pt < 1):
            raise UserError(f"plain_trials_from must be a number of requests >= 1, got {pt!r}")
        if pt is not None and (isinstance(pf, bool) or pt >= pf):
            raise UserError(f"plain_trials_from ({pt}) needs plain_fallback set to a larger number of requests "
                            f"(got {pf!r}): it governs the levels below plain_fallback's")
        if self.lookup and self.method != "dspark":
            raise UserError(f"lookup (hybrid drafting) combines prompt lookup with the dspark method's confidences, "
                            f"not with {self.method!r} (ngram with enable_adaptive_verification is lookup priced "
                            f"by the scheduler)")
        if self.drafter_weights not in DRAFTER_WEIGHTS:
            raise UserError(f"drafter_weights must be one of {', '.join(DRAFTER_WEIGHTS)}, got {self.drafter_weights!r}")
        if not isinstance(self.drafter_trust, bool):
            raise UserError(f"drafter_trust must be true or false, got {self.drafter_trust!r}")
        if self.lookup_calibration is not None and not (self.lookup or self.priced_lookup):
            raise UserError("lookup_calibration is given but no calibrated lookup runs (\"lookup\": true with "
                            "dspark, or ngram with enable_adaptive_verification)")
        if not isinstance(self.lookup_history, bool):
            raise UserError(f"lookup_history must be true or false, got {self.lookup_history!r}")
        if self.lookup_history and not (self.lookup or self.priced_lookup):
            raise UserError("lookup_history needs calibrated lookup (\"lookup\": true with dspark, or ngram with "
                            "enable_adaptive_verification)")
        if not 0 < self.confidence_threshold < 1:
            raise UserError(f"confidence_threshold must be in (0, 1), got {self.confidence_threshold!r}")
        if self.method == "mtp" and n not in (None, 1):
            raise UserError("mtp drafts exactly one token per round: num_speculative_tokens must be 1")
        if self.policy in CONFIDENCE_POLICIES and self.method not in ("dspark", "ngram"):
            raise UserError(
                f"verification_policy {self.policy!r} needs confidence estimates, which the dspark method "
                f"and calibrated prompt lookup (ngram) have; use 'fixed' with {self.method!r}"
            )

    @property
    def priced_lookup(self) -> bool:
        """ngram under a policy that reads confidences: calibrated lookup (LookupDrafter)."""
        return self.method == "ngram" and self.policy in CONFIDENCE_POLICIES

    @property
    def policy(self) -> str:
        if self.verification_policy:
            return self.verification_policy
        return "dspark-async" if self.enable_adaptive_verification else "fixed"

    @classmethod
    def from_dict(cls, d: dict) -> "SpeculativeConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise UserError(f"unknown speculative-config keys {unknown}; known: {sorted(known)}")
        return cls(**d)

    def drafter_path(self, target_name: str) -> Path | None:
        if self.method == "ngram" or self.model == "random":
            return None
        if self.model:
            p = Path(self.model).expanduser()
            if not p.is_dir():
                raise UserError(f"drafter checkpoint {self.model!r} is not a directory")
            return p
        shipped = SHIPPED_DIR / self.method
        if target_name != "default" or not (shipped / "config.json").is_file():
            raise UserError(
                f"no shipped {self.method} drafter for model {target_name!r}; pass \"model\": PATH to a "
                f"trained drafter (see `dspark train`)"
            )
        return shipped


def _check_non_negative_int(name: str, value, note: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UserError(f"{name} must be a non-negative integer{note}, got {value!r}")


def parse_speculative_arg(text: str | None) -> "SpeculativeConfig | str | None":
    """`--speculative-config` as given: None (missing) or 'default' -> "default",
    'none' -> None, else the JSON object as a SpeculativeConfig. The word `default`
    lets a caller that knows no engine (the load generator) ask for the server's own
    default by name."""
    import json

    if text is None or text.strip().lower() == "default":
        return "default"
    if text.strip().lower() == "none":
        return None
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"--speculative-config is not valid JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise UserError("--speculative-config must be a JSON object, 'default' or 'none'")
    return SpeculativeConfig.from_dict(cfg)


def resolve_speculative(spec: "SpeculativeConfig | str | None", target) -> "SpeculativeConfig | None":
    """The config to build the engine with; "default" (DEFAULT_SPECULATIVE) falls back
    to prompt lookup alone (LOOKUP_DEFAULT), with a warning, when no drafter is shipped
    for this target."""
    import logging

    if spec != "default":
        return spec
    default = SpeculativeConfig.from_dict(DEFAULT_SPECULATIVE)
    try:
        default.drafter_path(getattr(target, "family", target.name))
    except UserError as e:
        logging.getLogger("dspark.serve").warning(
            "%s. Until then: prompt lookup alone, %s (lengths priced by the scheduler; at one request, "
            "and from two only where it measures faster than plain decoding); --speculative-config none "
            "decodes without speculation.",
            e, json.dumps(LOOKUP_DEFAULT))
        return SpeculativeConfig.from_dict(LOOKUP_DEFAULT)
    return default
