"""`dspark bench fuzz|soak|overload|peers`: the server's reliability checks and the
comparison with other engines, each a tool with its own arguments (`--help` on each).
`overload` speaks HTTP only (dspark.bench); `fuzz` and `soak` start a dspark server
and compute a plain reference in-process, and `peers` loads our engine beside
llama.cpp's or vLLM's (dspark.eval)."""

from __future__ import annotations

import argparse
import importlib
import sys

#: subcommand -> (module with main(argv), help)
TOOLS = {
    "fuzz": ("dspark.eval.fuzz_server", "drawn malformed and edge-case API requests against a server; "
                                        "every one answered cleanly"),
    "soak": ("dspark.eval.soak", "minutes of misbehaving clients against `dspark serve`; nothing leaked or lost"),
    "overload": ("dspark.bench.overload", "more load than the server admits; refusals fast and clean, "
                                          "admitted requests served"),
}
#: `peers --engine` -> the module comparing our engine with that one
PEERS = {"llama.cpp": "dspark.eval.peers.llama_cpp", "vllm": "dspark.eval.peers.vllm"}


def register(bsub: argparse._SubParsersAction) -> None:
    for name, (module, text) in TOOLS.items():
        t = bsub.add_parser(name, help=text, add_help=False, description=f"{text} ({module}; --help for its "
                                                                         "arguments)")
        t.set_defaults(tool_args=[], func=lambda args, module=module, name=name: _run(module, args.tool_args, name))
    text = "our engine against llama.cpp's or vLLM's on the same target and prompts"
    p = bsub.add_parser("peers", help=text, add_help=False,
                        description=f"{text} (`--engine E --help` for that tool's arguments)")
    p.add_argument("--engine", choices=list(PEERS), help="the other engine (required)")
    p.set_defaults(tool_args=[], func=lambda args: _peers(p, args))


def _peers(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.engine is not None:
        return _run(PEERS[args.engine], args.tool_args, f"peers --engine {args.engine}")
    if any(a in ("-h", "--help") for a in args.tool_args):
        parser.print_help()
        return 0
    parser.error(f"--engine is required: one of {', '.join(PEERS)}")


def _run(module: str, argv: list[str], name: str | None = None) -> int:
    """The tool's main(argv); its usage lines say `dspark bench NAME` (argparse takes the
    program's name from sys.argv[0], which is `dspark` here)."""
    prog = sys.argv[0]
    sys.argv[0] = f"dspark bench {name or module.rpartition('.')[2]}"
    try:
        return importlib.import_module(module).main(argv) or 0
    finally:
        sys.argv[0] = prog
