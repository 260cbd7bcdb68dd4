"""`dspark profile`: measure the target's step-time curve for the prefix scheduler."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .common import add_model_args, load_target


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "profile",
        help="measure the target's step time by token count (the scheduler's cost curve)",
        description="Time one target forward for token counts 1..--max-tokens on a KV context of "
                    "--context-len tokens (medians after warm-up), make the curve monotone, and write "
                    "a JSON table plus a PNG plot. The table is cached per model, dtype, device and "
                    "machine; `dspark serve` reuses it.",
    )
    add_model_args(p)
    p.add_argument("--max-tokens", type=int, default=512, help="largest token count to time (default: %(default)s)")
    p.add_argument("--context-len", type=int, default=256, help="KV context per request (default: %(default)s)")
    p.add_argument("--tokens-per-request", type=int, default=8,
                   help="a step of n tokens is split into requests of this many tokens, like a verification "
                        "step (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per point; the median is kept (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=2, help="untimed runs per point (default: %(default)s)")
    p.add_argument("--out", type=Path, default=None, help="JSON path (default: the profile cache)")
    p.add_argument("--force", action="store_true", help="re-measure even if a cached table exists")
    p.add_argument("--json", action="store_true", help="print the table as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dspark.profiling.tables import profile_target

    target = load_target(args)
    table, path, cached = profile_target(target, args.max_tokens, args.context_len, args.tokens_per_request,
                                         args.repeats, args.warmup, args.out, args.force, quiet=args.json)
    if args.json:
        print(table.to_json())
        return 0
    png = (args.out or path).with_suffix(".png")
    plot_table(table, png)
    if cached:
        print(f"reused cached {path}; plot in {png}")
    elif (table.conditions or {}).get("cached", True):
        print(f"wrote {path} and {png}")
    else:
        print("measured on a busy machine: not cached" + (f" (written to {path} as asked)" if args.out else ""))
    for n in (1, 8, 16, 64, 128, 256, 512):
        if n <= table.token_counts[-1]:
            print(f"  {n:4d} tokens: {table.target_time(n) * 1000:7.1f} ms")
    return 0


def plot_table(table, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(table.token_counts, table.raw_ms, "o", ms=3, alpha=0.6, label="measured median")
    ax.plot(table.token_counts, table.step_ms, "-", label="monotone (used by the scheduler)")
    ax.set_xlabel("tokens in one forward")
    ax.set_ylabel("step time (ms)")
    ax.set_title(f"{table.model} {table.dtype} on {table.device}, context {table.context_len}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
