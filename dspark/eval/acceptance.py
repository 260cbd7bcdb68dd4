"""Offline acceptance: run held-out prompts through the real engine with a drafter at
a fixed verification length and read the engine's own counters.

τ (acceptance length) = (accepted drafts + 1 bonus/recovered token) per verification
round, and per position k the engine's `SpecStats` rate P(draft k accepted | draft k
was verified), i.e. at a fixed length the prefix rate P(drafts 1..k all accepted):
the real decoding numbers (greedy by default: the target's argmax decides). The
conditional acceptance P(k accepted | 1..k-1 accepted) is accepted_k / accepted_{k-1}
(accepted_0 = verified rounds); it is exact when every round verifies every
position, as a fixed length does except where a request's token budget runs out. A drafter that drafts fewer tokens
than asked (MTP-1: one) runs at its own maximum; results record the length used.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.errors import UserError
from dspark.sampling import SamplingParams
from dspark.engine.config import SpeculativeConfig


@dataclass
class AcceptanceResult:
    drafter: str  # label (checkpoint directory name)
    method: str
    block: int  # drafted tokens per round actually used
    domain: str
    num_prompts: int
    acceptance_length: float
    per_position: list[float] = field(default_factory=list)  # P(k accepted | k verified)
    conditional: list[float] = field(default_factory=list)  # P(k accepted | 1..k-1 accepted)
    rounds: int = 0
    output_tokens: int = 0
    wall_s: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


NGRAM = "ngram"  # `--drafter ngram`: model-free prompt lookup (n = 1..3), the drafter-free baseline
NGRAM_MAX_DRAFT = 15
HYBRID_SUFFIX = "+lookup"  # `--drafter DIR+lookup`: hybrid drafting with the dspark drafter DIR


def split_hybrid(path: str | Path) -> tuple[str, bool]:
    """(checkpoint path, whether hybrid lookup is asked for by the `+lookup` suffix)."""
    text = str(path)
    if text.endswith(HYBRID_SUFFIX):
        return text[: -len(HYBRID_SUFFIX)], True
    return text, False


def drafter_method(path: str | Path) -> tuple[str, int]:
    """(method, most tokens it drafts per round) from a checkpoint's config.json
    (`ngram` names prompt lookup; a `+lookup` suffix, hybrid drafting, needs dspark)."""
    from dspark.drafters.checkpoint import read_config

    if str(path) == NGRAM:
        return NGRAM, NGRAM_MAX_DRAFT
    base, hybrid = split_hybrid(path)
    cfg = read_config(base)
    if hybrid and cfg.method != "dspark":
        raise UserError(f"{base}: hybrid lookup (+lookup) needs a dspark drafter, this one is {cfg.method}")
    return cfg.method, cfg.max_draft_tokens


def heldout_prompt_ids(tokenizer, domains: list[str], num_prompts: int | None, max_prompt_tokens: int) -> dict[str, list[list[int]]]:
    """The first `num_prompts` held-out prompts of each domain (fixed order), chat-templated."""
    from dspark.data import load_prompts
    from dspark.data.prompts import stable_rank

    out = {}
    for d in domains:
        prompts = sorted(load_prompts("heldout", d), key=lambda p: stable_rank(p.id))
        ids = [tokenizer.apply_chat_template(p.messages) for p in prompts]
        ids = [x for x in ids if len(x) <= max_prompt_tokens]
        out[d] = ids[:num_prompts] if num_prompts else ids
    return out


def measure_acceptance(
    target,
    drafter_path: str | Path,
    block: int,
    prompts: list[list[int]],
    max_tokens: int = 128,
    temperature: float = 0.0,
    max_num_seqs: int = 8,
    max_model_len: int = 2048,
    domain: str = "",
    seed: int = 0,
    drafter_weights: str = "bf16",
) -> AcceptanceResult:
    method, most = drafter_method(drafter_path)
    used = min(block, most)
    if method == NGRAM:
        spec = SpeculativeConfig(method=NGRAM, num_speculative_tokens=used, verification_policy="fixed",
                                 prompt_lookup_min=1, prompt_lookup_max=3)
    else:
        base, hybrid = split_hybrid(drafter_path)
        spec = SpeculativeConfig(method=method, model=base, num_speculative_tokens=used,
                                 verification_policy="fixed", lookup=hybrid, drafter_weights=drafter_weights)
    engine = LLMEngine(target, spec, EngineConfig(max_num_seqs=max_num_seqs, max_model_len=max_model_len))
    params = [SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed + i) for i in range(len(prompts))]
    t0 = time.perf_counter()
    seqs = engine.generate(prompts, params)
    wall = time.perf_counter() - t0
    stats = engine.total_stats()
    label = Path(split_hybrid(drafter_path)[0]).name + (HYBRID_SUFFIX if split_hybrid(drafter_path)[1] else "")
    if method != NGRAM and drafter_weights != "bf16":
        label += f"@{drafter_weights}"
    return AcceptanceResult(label, method, used, domain, len(prompts), stats.acceptance_length,
                            stats.per_position_acceptance, conditional_acceptance(stats), stats.rounds,
                            sum(len(s.output_ids) for s in seqs), wall)


def conditional_acceptance(stats) -> list[float]:
    """accepted_k / accepted_{k-1} per position (accepted_0 = rounds that verified k=1);
    NaN where no round reached position k-1 accepted."""
    prev = stats.drafted_per_position[0] if stats.drafted_per_position else 0
    out = []
    for acc in stats.accepted_per_position:
        out.append(acc / prev if prev else float("nan"))
        prev = acc
    return out


def acceptance_plot(path: str | Path, results: list[AcceptanceResult]) -> Path:
    """One PNG: per-position conditional acceptance, a panel per (block, domain), a
    line per drafter (gaps where no round reached the position)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not results:
        raise UserError("no results to plot")
    blocks = sorted({r.block for r in results if r.block > 1} or {r.block for r in results})
    domains = list(dict.fromkeys(r.domain for r in results))
    fig, axes = plt.subplots(len(blocks), len(domains), figsize=(4.2 * len(domains), 3.4 * len(blocks)),
                             squeeze=False, sharey=True)
    for i, b in enumerate(blocks):
        for j, d in enumerate(domains):
            ax = axes[i][j]
            for r in results:
                if r.domain != d or (r.block != b and not (r.block == 1 and r.block < b)):
                    continue
                ys = r.conditional or r.per_position
                ax.plot(range(1, len(ys) + 1), ys, marker="o", ms=3,
                        label=f"{r.drafter} (τ {r.acceptance_length:.2f})")
            ax.set_title(f"{d}, block {b}")
            ax.set_xlabel("drafted position k")
            ax.set_ylim(0, 1)
            if j == 0:
                ax.set_ylabel("P(accept k | 1..k-1 accepted)")
            ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def format_table(results: list[AcceptanceResult]) -> str:
    """Markdown table: τ per drafter and block, one column per domain, plus the mean."""
    domains = list(dict.fromkeys(r.domain for r in results))
    rows = list(dict.fromkeys((r.drafter, r.method, r.block) for r in results))
    lines = ["| drafter | method | block | " + " | ".join(domains) + " | mean |",
             "|---|---|---|" + "---|" * (len(domains) + 1)]
    for name, method, block in rows:
        taus = [next((r.acceptance_length for r in results
                      if (r.drafter, r.method, r.block, r.domain) == (name, method, block, d)), float("nan"))
                for d in domains]
        mean = sum(taus) / len(taus)
        lines.append(f"| {name} | {method} | {block} | " + " | ".join(f"{t:.2f}" for t in taus) + f" | {mean:.2f} |")
    return "\n".join(lines)
