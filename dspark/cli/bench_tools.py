"""`dspark bench fuzz|soak|overload|peers`: the server's reliability checks and the
comparison with other engines, each a tool with its own arguments (`--help` on each).
`overload` speaks HTTP only (dspark.bench); `fuzz` and `soak` start a dspark server
and compute a plain reference in-process, and `peers` loads our engine beside
llama.cpp's or vLLM's (dspark.eval)."""

from __future__ import annotations

import argparse
import importlib

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
        t.set_defaults(tool_args=[], func=lambda args, module=module: _run(module, args.tool_args))
    p = bsub.add_parser("peers", help="our engine against llama.cpp's or vLLM's on the same target and prompts",
                        add_help=False)
    p.add_argument("--engine", required=True, choices=list(PEERS))
    p.set_defaults(tool_args=[], func=lambda args: _run(PEERS[args.engine], args.tool_args))


def _run(module: str, argv: list[str]) -> int:
    return importlib.import_module(module).main(argv) or 0
