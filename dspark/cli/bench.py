"""`dspark bench`: online serving benchmarks over HTTP (`serve`, `sweep`, `ab`) and
reports from saved sweeps (`report`)."""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import signal
import sys
from contextlib import contextmanager
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="serving benchmarks against any OpenAI-compatible server")
    p.set_defaults(func=lambda _: p.print_help())
    bsub = p.add_subparsers(dest="bench_command",
                            metavar="{serve,sweep,ab,report,record,engine,fuzz,soak,overload,peers}")

    s = bsub.add_parser(
        "serve", help="load one running server and report latency, throughput and acceptance",
        description="Send held-out math/code/chat prompts (or a JSONL file) to an OpenAI-compatible server, "
                    "streaming every request, closed loop (--max-concurrency) or open loop (--request-rate, "
                    "Poisson). Reports request/output/total throughput, per-user tok/s, TTFT, TPOT, ITL, "
                    "end-to-end latency (mean, median, percentiles), goodput under SLOs, failures, and the "
                    "speculative-decoding acceptance read from the server's /metrics (dspark: or vllm: "
                    "counters). TPOT = (E2EL - TTFT) / (output tokens - 1) per request; per-user tok/s = "
                    "1/TPOT; ITL is one sample per streamed text chunk, so with speculative decoding (several "
                    "tokens per chunk) ITL exceeds TPOT.",
    )
    s.add_argument("--base-url", default="http://127.0.0.1:8000",
                   help="server root, with or without /v1 (default: %(default)s)")
    s.add_argument("--max-concurrency", type=int, default=None,
                   help="closed loop: at most N requests in flight (default: unbounded)")
    s.add_argument("--request-rate", type=_rate, default=math.inf,
                   help="open loop: requests per second, Poisson arrivals drawn from --seed; inf = all at once "
                        "(default: inf)")
    s.add_argument("--burstiness", type=float, default=1.0,
                   help="gamma shape of the arrival gaps; 1 = Poisson, lower = burstier (default: %(default)s)")
    s.add_argument("--num-prompts", type=int, default=100, help="measured requests (default: %(default)s)")
    s.add_argument("--num-warmups", type=int, default=0,
                   help="unmeasured requests sent first (default: %(default)s)")
    s.add_argument("--metrics-url", default=None,
                   help="Prometheus endpoint for acceptance (default: BASE_URL/metrics)")
    s.add_argument("--json-out", default=None, metavar="FILE",
                   help="write every figure and the run's configuration as JSON")
    s.add_argument("--save-detailed", action="store_true",
                   help="with --json-out: include each request's timings")
    _add_load_args(s)
    s.set_defaults(func=run_serve)

    w = bsub.add_parser(
        "sweep", help="serve each configuration, load them in alternating rounds at a concurrency ladder, plot",
        description="Start every configuration's server (`dspark serve`, a given command, or a running URL) on "
                    "127.0.0.1 with a free port and wait for its /health; all stay up together. Then, in each of "
                    "--rounds rounds, load every configuration at every concurrency (closed loop), the "
                    "configurations taking turns at each concurrency and round r starting at configuration r "
                    "mod n, so that the machine's drift over the sweep falls on every configuration alike. Each "
                    "point is the median over rounds with its spread (min-max); each configuration against the "
                    "--reference is a ratio taken within each round (paired), reported as the median and spread "
                    "of those ratios. Servers are stopped at the end (SIGTERM, then SIGKILL after --grace-period; "
                    "the whole process group). Writes into --out: sweep.json, sweep.md (points, SLA tiers, "
                    "paired ratios), pareto.png (output tok/s against per-user tok/s, labelled by concurrency), "
                    "throughput_vs_concurrency.png, ratios.png, and each server's log under logs/.",
    )
    w.add_argument("--out", required=True, metavar="DIR", help="output directory")
    w.add_argument("--configs", nargs="+", metavar="CONFIG", default=None,
                   help="configurations: a name (none, mtp, eagle3, dflash, dspark, dspark-adaptive, ngram, hybrid), "
                        "NAME=JSON (a --speculative-config for dspark serve; NAME=none for none), NAME=URL (an "
                        "already running server) or NAME=CMD (a shell command with {port} that starts a server; "
                        "the sweep stops it). Default: none mtp eagle3 dflash dspark dspark-adaptive, with the "
                        "shipped drafters")
    w.add_argument("--concurrency", type=_int_list, default=[1, 4, 16, 32],
                   help="concurrency ladder, comma-separated (default: 1,4,16,32)")
    w.add_argument("--tiers", type=_float_list, default=[10.0, 20.0, 40.0],
                   help="SLA tiers in per-user tok/s, comma-separated (default: 10,20,40)")
    w.add_argument("--reference", default=None, metavar="NAME",
                   help="configuration the report compares the others with (default: none if swept, else the "
                        "first)")
    _add_round_args(w, rounds=3)
    _add_load_args(w)
    w.set_defaults(func=run_sweep)

    ab = bsub.add_parser(
        "ab", help="paired A/B: two configurations in alternating rounds, B/A with its spread",
        description="A sweep of two configurations (same syntax as `sweep --configs`) in --rounds alternating "
                    "rounds (A B, B A, A B, ...), both servers up together (or each for its turn with "
                    "--one-server-at-a-time). Prints, per concurrency, B's output and per-user tok/s as "
                    "multiples of A's: the median of the per-round ratios and their min-max. The full report "
                    "(sweep.md, sweep.json, plots, server logs) goes into --out.",
    )
    ab.add_argument("a", metavar="A", help="the reference configuration, e.g. none or plain=http://host:8000")
    ab.add_argument("b", metavar="B", help="the configuration compared with it")
    ab.add_argument("--out", required=True, metavar="DIR", help="output directory")
    ab.add_argument("--concurrency", type=_int_list, default=[1],
                    help="concurrencies, comma-separated (default: 1)")
    _add_round_args(ab, rounds=6)
    _add_load_args(ab)
    ab.set_defaults(func=run_ab)

    r = bsub.add_parser(
        "report", help="rewrite a sweep's table and plots, or merge several sweeps into one report",
        description="Read one or more sweep.json files (from `dspark bench sweep`) and write sweep.json, sweep.md "
                    "and the plots into --out, with the Pareto marks, SLA tiers, ratios against the reference "
                    "and frontier dominance recomputed over all their configurations. Sweeps merged must share "
                    "the load (dataset, endpoint, max tokens, temperature, ignore_eos, seed); configuration "
                    "names must be unique across them. Ratios between configurations of one sweep stay paired "
                    "by round; between configurations of different sweeps they are ratios of medians, marked "
                    "`*`, since the machine may have drifted between the sweeps.",
    )
    r.add_argument("sweeps", nargs="+", metavar="SWEEP_JSON", help="sweep.json files, in report order")
    r.add_argument("--out", required=True, metavar="DIR", help="output directory")
    r.add_argument("--tiers", type=_float_list, default=None,
                   help="SLA tiers in per-user tok/s, comma-separated (default: the first sweep's)")
    r.add_argument("--reference", default=None, metavar="NAME",
                   help="configuration the others are compared with (default: the first sweep's choice)")
    r.add_argument("--drop", nargs="+", default=[], metavar="NAME",
                   help="leave these configurations out")
    r.add_argument("--replace", action="store_true",
                   help="a configuration in several sweeps keeps its last sweep's measurement, in its first place "
                        "(e.g. one measured again on a quieter machine); default: refuse")
    r.set_defaults(func=run_report)

    from . import bench_engine

    bench_engine.register(bsub)  # the engine alone, in one process: it imports the engine only when run
    from . import bench_record, bench_tools

    bench_record.register(bsub)  # a sweep as a results record
    bench_tools.register(bsub)  # fuzz, soak, overload, peers: tools with their own arguments


def _add_round_args(p: argparse.ArgumentParser, rounds: int) -> None:
    p.add_argument("--rounds", type=int, default=rounds,
                   help="each point is measured once per round, the configurations alternating; the report gives "
                        "medians over rounds, their spread and per-round (paired) ratios (default: %(default)s)")
    p.add_argument("--one-server-at-a-time", action="store_true",
                   help="start each configuration's server for its turn in every round and stop it after (for "
                        "servers that do not fit in memory together; each round pays every start-up)")
    p.add_argument("--num-prompts", type=int, default=None,
                   help="measured requests per point (default: 4 x concurrency, at least 16); every point of "
                        "every round gets prompts no other point sends, while the dataset holds enough (else "
                        "a warning, and the report says what repeats)")
    p.add_argument("--num-warmups", type=int, default=None,
                   help="unmeasured requests before each point (default: the concurrency)")
    p.add_argument("--server-args", default="",
                   help='extra flags for every started `dspark serve`, e.g. "--model DIR --dtype bf16 '
                        '--max-model-len 4096"')
    p.add_argument("--server-timeout", type=float, default=900.0,
                   help="seconds to wait for a server's /health (default: %(default)s)")
    p.add_argument("--grace-period", type=float, default=30.0,
                   help="seconds between SIGTERM and SIGKILL when stopping a server (default: %(default)s)")


def _add_load_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("requests")
    g.add_argument("--endpoint", choices=["chat", "completions"], default="chat",
                   help="/v1/chat/completions or /v1/completions (default: %(default)s)")
    g.add_argument("--model", default=None, help="model name in requests (default: the first of GET /v1/models)")
    g.add_argument("--api-key", default=os.environ.get("DSPARK_API_KEY") or os.environ.get("OPENAI_API_KEY"),
                   help="bearer token (default: $DSPARK_API_KEY, else $OPENAI_API_KEY, else none)")
    g.add_argument("--dataset", choices=["math", "code", "chat", "mixed"], default="mixed",
                   help="held-out prompts: GSM8K tail, HumanEval, MT-Bench, or all three (default: %(default)s)")
    g.add_argument("--dataset-path", default=None, metavar="JSONL",
                   help='prompts from a file instead, one {"prompt": ...} or {"messages": [...]} per line '
                        '(optional "max_tokens")')
    g.add_argument("--seed", type=int, default=0, help="prompt order and arrival times (default: %(default)s)")
    g.add_argument("--max-tokens", type=int, default=256, help="output tokens per request (default: %(default)s)")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default: %(default)s)")
    g.add_argument("--ignore-eos", action="store_true",
                   help="send ignore_eos=true (an extension field) so every request runs to --max-tokens")
    g.add_argument("--extra-body", type=_json_object, default={}, metavar="JSON",
                   help='more request fields, e.g. \'{"top_p": 0.9}\'')
    g.add_argument("--goodput", nargs="+", default=[], metavar="KEY:MS",
                   help="SLOs for goodput: ttft:MS tpot:MS e2el:MS (any of them)")
    g.add_argument("--percentiles", type=_float_list, default=[99.0],
                   help="latency percentiles to report, comma-separated (default: 99)")
    g.add_argument("--request-timeout", type=float, default=600.0,
                   help="seconds one request may take (default: %(default)s)")
    g.add_argument("--disable-tqdm", action="store_true", help="no progress bar")


def _rate(text: str) -> float:
    x = float(text)  # accepts "inf"
    if not x > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 or inf, got {text}")
    return x


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _float_list(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _json_object(text: str) -> dict:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return obj


def _load_config(args: argparse.Namespace, **overrides):
    from dspark.bench import BenchError, LoadConfig
    from dspark.bench.stats import parse_goodput

    try:
        goodput = parse_goodput(args.goodput)
    except ValueError as e:
        raise BenchError(f"--goodput: {e}") from None
    fields = dict(
        endpoint=args.endpoint, model=args.model, api_key=args.api_key, dataset=args.dataset,
        dataset_path=args.dataset_path, seed=args.seed, max_tokens=args.max_tokens,
        temperature=args.temperature, ignore_eos=args.ignore_eos, extra_body=args.extra_body,
        goodput=goodput, percentiles=tuple(args.percentiles),
        request_timeout=args.request_timeout, progress=not args.disable_tqdm,
    )
    fields.update(overrides)
    return LoadConfig(**fields)


@contextmanager
def _user_errors():
    """Benchmark and data mistakes as one-line CLI errors."""
    from dspark.bench.dataset import DatasetError
    from dspark.bench.runner import BenchError
    from dspark.errors import UserError

    try:
        yield
    except (BenchError, DatasetError) as e:
        raise UserError(str(e)) from None


def run_serve(args: argparse.Namespace) -> int:
    from dspark.bench import run_benchmark
    from dspark.bench.report import format_result

    with _user_errors():
        config = _load_config(args, base_url=args.base_url, num_prompts=args.num_prompts,
                              num_warmups=args.num_warmups, max_concurrency=args.max_concurrency,
                              request_rate=args.request_rate, burstiness=args.burstiness,
                              metrics_url=args.metrics_url, save_detailed=args.save_detailed)
        result = run_benchmark(config)
    print(format_result(result))
    if args.json_out:
        path = Path(args.json_out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2, allow_nan=False) + "\n")
        print(f"wrote {path}", file=sys.stderr)
    return 0 if result["completed"] else 1


def _sweep_config(args: argparse.Namespace, configs: list, reference: str | None, tiers: list[float]):
    from dspark.bench.sweep import SweepConfig

    return SweepConfig(
        out_dir=Path(args.out), configs=configs, concurrencies=args.concurrency,
        load=_load_config(args, base_url="http://127.0.0.1"), tiers=tiers, rounds=args.rounds,
        together=not args.one_server_at_a_time, num_prompts=args.num_prompts, num_warmups=args.num_warmups,
        server_args=shlex.split(args.server_args), server_timeout=args.server_timeout,
        grace_period=args.grace_period, reference=reference, command=shlex.join(["dspark", *args.cli_argv]))


def _failed_configs(result: dict, out_dir: Path) -> None:
    from dspark.errors import UserError

    failed = [c["name"] for c in result["configs"] if c["status"] != "ok"]
    if failed:
        raise UserError(f"{len(failed)} of {len(result['configs'])} configurations failed ({', '.join(failed)}); "
                        f"their errors are above and in {out_dir / 'sweep.md'}, their logs in {out_dir / 'logs'}")


def run_sweep(args: argparse.Namespace) -> int:
    from dspark.bench.sweep import DEFAULT_CONFIGS, parse_server_config, run_sweep as sweep

    with _user_errors():
        configs = [parse_server_config(c) for c in (args.configs or list(DEFAULT_CONFIGS))]
        config = _sweep_config(args, configs, args.reference, args.tiers)
        with _terminate_as_exit():
            result = sweep(config)
    print((config.out_dir / "sweep.md").read_text())
    written = sorted(p.name for p in config.out_dir.iterdir() if p.is_file())
    print(f"wrote {', '.join(written)} into {config.out_dir}", file=sys.stderr)
    _failed_configs(result, config.out_dir)
    return 0


def run_ab(args: argparse.Namespace) -> int:
    from dspark.bench.sweep import parse_server_config, run_sweep as sweep
    from dspark.bench.sweep_report import ab_summary

    with _user_errors():
        a, b = parse_server_config(args.a), parse_server_config(args.b)
        config = _sweep_config(args, [a, b], a.name, [])
        with _terminate_as_exit():
            result = sweep(config)
    summary = ab_summary(result)
    if summary:
        print(summary)
    print(f"full report: {config.out_dir / 'sweep.md'}", file=sys.stderr)
    _failed_configs(result, config.out_dir)
    return 0


def run_report(args: argparse.Namespace) -> int:
    from dspark.bench.sweep import merge_results, write_report
    from dspark.errors import UserError

    results = []
    for name in args.sweeps:
        try:
            results.append(json.loads(Path(name).read_text()))
        except (OSError, json.JSONDecodeError) as e:
            raise UserError(f"cannot read sweep results {name}: {e}") from None
        if not isinstance(results[-1], dict) or not {"sweep", "configs", "points"} <= set(results[-1]):
            raise UserError(f"{name} is not a sweep.json written by `dspark bench sweep`")
    with _user_errors():
        merged = merge_results(results, tiers=args.tiers, reference=args.reference, drop=args.drop,
                               replace_repeated=args.replace)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_report(merged, out)
    print((out / "sweep.md").read_text())
    print(f"wrote sweep.json, sweep.md and the plots into {out}", file=sys.stderr)
    return 0


@contextmanager
def _terminate_as_exit():
    """SIGTERM raises SystemExit, so the servers a sweep started are stopped on the
    way out rather than left running."""
    def handler(signum, frame):
        raise SystemExit(128 + signum)

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: signals are not ours to handle
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
