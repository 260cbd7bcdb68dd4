"""`dspark serve`: the OpenAI-compatible HTTP server."""

from __future__ import annotations

import argparse
import logging
import os

from .common import add_model_args, add_speculative_arg


def register(sub: argparse._SubParsersAction) -> None:
    # the defaults are the config dataclasses' own (stated once, there)
    from dspark.engine.config import EngineConfig
    from dspark.serve.config import ServeConfig

    p = sub.add_parser(
        "serve",
        help="serve the model over an OpenAI-compatible HTTP API with speculative decoding",
        description="Serve POST /v1/chat/completions and /v1/completions (streaming or not), GET /v1/models, "
                    "/health and /metrics (Prometheus) with continuous batching and lossless speculative "
                    "decoding. /health and /metrics answer from the first second: /health is 503 with "
                    "{\"status\": \"loading\"|\"profiling\"} until the model is loaded and the step times "
                    "are measured, then 200. Stops gracefully on SIGINT/SIGTERM.",
    )
    add_model_args(p)
    add_speculative_arg(p)
    h = p.add_argument_group("HTTP")
    h.add_argument("--host", default=ServeConfig.host,
                   help="address to listen on; 0.0.0.0 for every interface (default: %(default)s)")
    h.add_argument("--port", type=int, default=ServeConfig.port, help="TCP port (default: %(default)s)")
    env_key = os.environ.get("DSPARK_API_KEY")
    h.add_argument("--api-key", nargs="+", default=[env_key] if env_key else None, metavar="KEY",
                   help="require 'Authorization: Bearer KEY' on /v1/*, the live view's data and /metrics; several "
                        "keys are several tenants (key-1, key-2, ...), whose prefix cache and reply history are "
                        "kept apart (default: $DSPARK_API_KEY, else no key)")
    h.add_argument("--api-keys-file", default=None, metavar="PATH",
                   help="keys and their tenants, one 'KEY TENANT' a line (# comments); keys of one tenant share "
                        "its namespace (docs/serving-several-users.md)")
    h.add_argument("--metrics-public", action="store_true",
                   help="let /metrics answer without a key when keys are configured (it holds aggregate counts "
                        "of every tenant's traffic)")
    h.add_argument("--stream-chunk-tokens", type=int, default=ServeConfig.stream_chunk_tokens, metavar="N",
                   help="stream tokens in groups of N, so that a chunk's size no longer shows how many of its "
                        "tokens were drafted (costs time to the first token); 0 = one chunk per engine step "
                        "(default: %(default)s)")
    h.add_argument("--max-request-bytes", type=int, default=ServeConfig.max_request_bytes,
                   help="request bodies over this many bytes are refused with 413 (default: %(default)s = 4 MiB)")
    h.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                   help="model name(s) clients may send in \"model\", all listed by /v1/models; the first "
                        "labels the metrics (default: the model directory's name; SmolLM2-135M-Instruct "
                        "for the default model)")
    e = p.add_argument_group("scheduling")
    e.add_argument("--max-num-seqs", type=int, default=EngineConfig.max_num_seqs,
                   help="requests decoded together in one batch; each holds one KV slot of --max-model-len "
                        "tokens (default: %(default)s)")
    e.add_argument("--max-waiting", type=int, default=EngineConfig.max_waiting,
                   help="requests that may wait for a batch slot; beyond it the server answers 429 "
                        "(default: %(default)s)")
    e.add_argument("--max-prefill-tokens", type=int, default=EngineConfig.max_prefill_tokens,
                   help="prompt tokens per step: a longer prompt is prefilled in chunks over several steps "
                        "while running requests keep decoding (default: %(default)s)")
    e.add_argument("--no-prefix-caching", dest="prefix_caching", action="store_false",
                   help="do not keep recent prompts' keys and values for prompts that begin the same way (on "
                        "by default in the batch-invariant CPU precisions, where reusing them is exact)")
    o = p.add_argument_group("operations")
    o.add_argument("--log-interval", type=float, default=ServeConfig.log_interval,
                   help="seconds between log lines with throughput, running/waiting requests and acceptance "
                        "since the previous line; 0 = off (default: %(default)s)")
    o.add_argument("--shutdown-timeout", type=float, default=ServeConfig.shutdown_timeout,
                   help="seconds in-flight requests get to finish after SIGINT/SIGTERM (default: %(default)s)")
    o.add_argument("--ready-wait", type=float, default=ServeConfig.ready_wait,
                   help="seconds a request that arrives while the model loads waits for it before the server "
                        "answers 503 (/health answers at once with the phase); 0 = answer 503 at once "
                        "(default: %(default)s)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dspark.engine.config import EngineConfig
    from dspark.serve import ServeConfig, create_app, run_server
    from dspark.engine.config import parse_speculative_arg

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    spec = parse_speculative_arg(args.speculative_config)
    config = ServeConfig(
        model=args.model, dtype=args.dtype, device=args.device, threads=args.threads, speculative=spec,
        engine=EngineConfig(max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
                            max_waiting=args.max_waiting, max_prefill_tokens=args.max_prefill_tokens,
                            prefix_caching=args.prefix_caching),
        host=args.host, port=args.port, api_key=args.api_key, api_keys_file=args.api_keys_file,
        metrics_public=args.metrics_public, stream_chunk_tokens=args.stream_chunk_tokens,
        served_model_names=args.served_model_name or [], log_interval=args.log_interval,
        shutdown_timeout=args.shutdown_timeout, ready_wait=args.ready_wait, max_request_bytes=args.max_request_bytes,
    )
    app = create_app(config, build=False)  # built by run_server, while /health already answers
    return 0 if run_server(app, config.host, config.port, config.shutdown_timeout) else 1
