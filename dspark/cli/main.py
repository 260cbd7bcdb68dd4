"""The `dspark` command. Each subcommand lives in its own module exposing
`register(subparsers)`; user errors raise `UserError` and print without a traceback."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# subcommand -> module under dspark.cli
SUBCOMMANDS = {
    "generate": "generate",
    "profile": "profile",
    "serve": "serve",
    "data": "data",
    "train": "train",
    "calibrate": "calibrate",
    "calibrate-lookup": "calibrate_lookup",
    "export": "export",
    "quantize": "quantize",
    "eval": "eval",
    "bench": "bench",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dspark",
        description=(
            "DSpark speculative decoding: train a drafter for your model, calibrate it, "
            "serve the model faster with output exactly equal to the target's, and "
            "measure the gain against baselines."
        ),
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, mod in SUBCOMMANDS.items():
        importlib.import_module(f"dspark.cli.{mod}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from dspark.runtime.allocator import tune_allocator

    tune_allocator()  # before the first large tensor: see dspark/runtime/allocator.py
    parser = build_parser()
    # a tool with its own arguments (`dspark bench soak ...`) takes the ones this parser
    # does not know; every other command refuses them
    args, extra = parser.parse_known_args(argv)
    if extra and not hasattr(args, "tool_args"):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:
        args.tool_args = extra
    args.cli_argv = list(sys.argv[1:] if argv is None else argv)  # what a benchmark's provenance names
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except Exception as e:  # user-caused errors get one line, the rest a traceback
        if _is_user_error(e) and not os.environ.get("DSPARK_DEBUG"):
            print(f"dspark {args.command}: error: {e}", file=sys.stderr)
            return 2
        raise


def _is_user_error(e: Exception) -> bool:
    from dspark.errors import USER_ERRORS

    return isinstance(e, USER_ERRORS)


if __name__ == "__main__":
    sys.exit(main())
