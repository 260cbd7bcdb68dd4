"""`run_sweep`: every server configuration at every concurrency of a ladder.

A configuration is one of
- a `dspark serve` speculative config (JSON, or `none`): the sweep starts
  `dspark serve` on 127.0.0.1 with a free port and the shared `server_args`;
- `name=URL`: a server that is already running; the sweep only sends load;
- `name=CMD`: a shell command with a `{port}` placeholder that starts an
  OpenAI-compatible server; the sweep runs it and stops it.

Each started server is waited for on `/health`, loaded at each concurrency (closed
loop, `repeats` times), then stopped (`server_process.ServerProcess`). A
configuration that fails to start is recorded with its log and the sweep goes on.
Each point reports the median over its repeats and their spread (min, max).

The per-user speed of a point is the median over its requests of 1/TPOT
(`stats.py`); SLA tiers keep, for each configuration, the highest output
throughput among its points whose per-user speed reaches the tier.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from .dataset import DatasetError, jsonl_prompts, heldout_prompts, sample_prompts
from .runner import BenchError, LoadConfig, run_benchmark
from .server_process import ServerProcess, ServerStartError, dspark_serve_command, free_port
from .sweep_report import usable_point, write_outputs

#: the configurations a sweep compares by default, with the drafters shipped for the model
DEFAULT_CONFIGS: dict[str, dict | None] = {
    "none": None,
    "mtp": {"method": "mtp"},
    "eagle3": {"method": "eagle3"},
    "dflash": {"method": "dflash", "enable_adaptive_verification": False},
    "dspark": {"method": "dspark", "enable_adaptive_verification": False},
    "dspark-adaptive": {"method": "dspark", "enable_adaptive_verification": True},
}
#: names `--configs` accepts on their own
KNOWN_CONFIGS: dict[str, dict | None] = {**DEFAULT_CONFIGS, "ngram": {"method": "ngram"}}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")

# point figures that get a median and spread over repeats: key -> path in a result
POINT_FIGURES: dict[str, tuple[str, ...]] = {
    "request_throughput": ("request_throughput",),
    "output_throughput": ("output_throughput",),
    "total_token_throughput": ("total_token_throughput",),
    "per_user_tps": ("per_user_tps", "median"),
    "per_user_tps_mean": ("per_user_tps", "mean"),
    "ttft_ms": ("ttft_ms", "median"),
    "ttft_ms_p99": ("ttft_ms", "p99"),
    "tpot_ms": ("tpot_ms", "median"),
    "tpot_ms_p99": ("tpot_ms", "p99"),
    "itl_ms": ("itl_ms", "median"),
    "itl_ms_p99": ("itl_ms", "p99"),
    "e2el_ms": ("e2el_ms", "median"),
    "acceptance_length": ("spec_decode", "acceptance_length"),
    "mean_tokens_per_chunk": ("mean_tokens_per_chunk",),
    "failed": ("failed",),
}


@dataclass(frozen=True)
class ServerConfig:
    name: str
    kind: str  # "dspark" | "url" | "command"
    speculative: dict | None = None  # kind "dspark": None = no speculation
    url: str | None = None
    command: str | None = None

    def describe(self) -> dict:
        if self.kind == "dspark":
            return {"name": self.name, "kind": self.kind, "speculative_config": self.speculative}
        return {"name": self.name, "kind": self.kind, self.kind: self.url or self.command}


def parse_server_config(item: str) -> ServerConfig:
    """`NAME` (one of KNOWN_CONFIGS), `NAME=JSON`, `NAME=none`, `NAME=URL` or `NAME=CMD`."""
    name, sep, value = item.partition("=")
    name, value = name.strip(), value.strip()
    if not _NAME.fullmatch(name):
        raise BenchError(f"configuration name {name!r} must be letters, digits and ._+- (it names files)")
    if not sep:
        if name not in KNOWN_CONFIGS:
            raise BenchError(f"unknown configuration {name!r}; use one of {', '.join(KNOWN_CONFIGS)} or "
                             "NAME=JSON, NAME=URL, NAME=CMD")
        return ServerConfig(name, "dspark", KNOWN_CONFIGS[name])
    if value.lower() == "none":
        return ServerConfig(name, "dspark", None)
    if value.startswith("{"):
        try:
            spec = json.loads(value)
        except json.JSONDecodeError as e:
            raise BenchError(f"configuration {name!r}: the speculative config is not valid JSON: {e}") from None
        if not isinstance(spec, dict):
            raise BenchError(f"configuration {name!r}: the speculative config must be a JSON object")
        return ServerConfig(name, "dspark", spec)
    if value.startswith(("http://", "https://")):
        return ServerConfig(name, "url", url=value)
    if "{port}" not in value:
        raise BenchError(f"configuration {name!r}: a start command needs a {{port}} placeholder for the port "
                         f"the sweep chooses, got {value!r}")
    return ServerConfig(name, "command", command=value)


@dataclass
class SweepConfig:
    out_dir: Path
    configs: list[ServerConfig]
    concurrencies: list[int]
    #: the load of every point; base_url, max_concurrency, num_prompts and num_warmups are set per point
    load: LoadConfig
    tiers: list[float] = field(default_factory=list)
    repeats: int = 1
    #: prompts per point; None = max(16, 4 x concurrency)
    num_prompts: int | None = None
    #: warm-up requests per point; None = the concurrency
    num_warmups: int | None = None
    server_args: list[str] = field(default_factory=list)
    server_timeout: float = 900.0
    grace_period: float = 30.0
    #: the configuration others are compared with in the report (None: `none`, else the first)
    reference: str | None = None

    def __post_init__(self) -> None:
        self.out_dir = Path(self.out_dir)
        if not self.configs:
            raise BenchError("no configurations to sweep")
        names = [c.name for c in self.configs]
        if len(set(names)) != len(names):
            raise BenchError(f"configuration names must be unique, got {names}")
        if not self.concurrencies or min(self.concurrencies) < 1:
            raise BenchError(f"--concurrency must be integers >= 1, got {self.concurrencies}")
        if any(not t > 0 for t in self.tiers):
            raise BenchError(f"--tiers must be per-user tok/s > 0, got {self.tiers}")
        if self.repeats < 1:
            raise BenchError(f"--repeats must be >= 1, got {self.repeats}")
        if self.num_prompts is not None and self.num_prompts < 1:
            raise BenchError(f"--num-prompts must be >= 1, got {self.num_prompts}")
        if self.num_warmups is not None and self.num_warmups < 0:
            raise BenchError(f"--num-warmups must be >= 0, got {self.num_warmups}")
        if not self.server_timeout > 0 or self.grace_period < 0:
            raise BenchError("--server-timeout must be > 0 and --grace-period >= 0 seconds")
        if self.reference is not None and self.reference not in names:
            raise BenchError(f"--reference {self.reference!r} is not one of the configurations {names}")

    def prompts_at(self, concurrency: int) -> int:
        return self.num_prompts or max(16, 4 * concurrency)

    def warmups_at(self, concurrency: int) -> int:
        return concurrency if self.num_warmups is None else self.num_warmups

    def describe(self) -> dict:
        load = self.load.describe()
        for key in ("base_url", "max_concurrency", "num_prompts", "num_warmups", "model", "metrics_url"):
            load.pop(key, None)
        return {"concurrencies": self.concurrencies, "tiers": self.tiers, "repeats": self.repeats,
                "num_prompts": self.num_prompts or "max(16, 4 x concurrency)",
                "num_warmups": "concurrency" if self.num_warmups is None else self.num_warmups,
                "server_args": self.server_args, "server_timeout_s": self.server_timeout, "load": load,
                "reference": self.reference}


def run_sweep(cfg: SweepConfig, log=None) -> dict:
    """Run the sweep, writing sweep.json, sweep.md and the plots into `cfg.out_dir`
    after every configuration; returns what sweep.json holds."""

    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    most = max(cfg.warmups_at(c) + cfg.prompts_at(c) for c in cfg.concurrencies)
    try:
        pool = (jsonl_prompts(cfg.load.dataset_path) if cfg.load.dataset_path
                else heldout_prompts(cfg.load.dataset, most))
    except DatasetError as e:
        raise BenchError(str(e)) from None
    result = {"sweep": cfg.describe(), "configs": [], "points": [], "tiers": []}
    for server in cfg.configs:
        entry = {**server.describe(), "status": "ok", "error": None, "startup_s": None, "log": None}
        result["configs"].append(entry)
        log(f"[{server.name}] starting" if server.kind != "url" else f"[{server.name}] using {server.url}")
        try:
            with _LaunchedServer(server, cfg, entry) as url:
                for c in cfg.concurrencies:
                    point = _run_point(server.name, url, c, cfg, pool, log)
                    result["points"].append(point)
        except (ServerStartError, BenchError) as e:
            entry["status"], entry["error"] = "failed", str(e)
            log(f"[{server.name}] FAILED: {e}")
        write_report(result, cfg.out_dir)
    return result


def write_report(result: dict, out_dir: Path) -> None:
    """Recompute the Pareto marks and the tier table of `result`, then write it."""
    result["tiers"] = tier_table(result["points"], result["sweep"]["tiers"], [c["name"] for c in result["configs"]])
    mark_pareto(result["points"])
    write_outputs(result, out_dir)


#: load settings that must agree for points of several sweeps to be compared
_COMPARABLE = ("dataset", "dataset_path", "endpoint", "max_tokens", "temperature", "ignore_eos", "seed")


def merge_results(results: list[dict], tiers: list[float] | None = None, reference: str | None = None,
                  drop: list[str] = (), replace_repeated: bool = False) -> dict:
    """One report from several sweep.json results (e.g. a configuration measured
    later): configurations and points are concatenated, less those named in `drop`;
    a name in several sweeps is refused, or with `replace_repeated` keeps the last
    sweep's measurement in the first one's place. The load settings must match."""
    if not results:
        raise BenchError("no sweep results to report")
    unknown = sorted(set(drop) - {c["name"] for r in results for c in r["configs"]})
    if unknown:
        raise BenchError(f"--drop {unknown}: no such configuration in these sweeps")
    first = results[0]
    merged = {"sweep": copy.deepcopy(first["sweep"]), "configs": [], "points": [], "tiers": []}
    for r in results:
        for key in _COMPARABLE:
            a, b = first["sweep"]["load"].get(key), r["sweep"]["load"].get(key)
            if a != b:
                raise BenchError(f"the sweeps differ in {key} ({a!r} against {b!r}); their points are not comparable")
        for c in r["configs"]:
            if c["name"] in drop:
                continue
            if any(m["name"] == c["name"] for m in merged["configs"]):
                if not replace_repeated:
                    raise BenchError(f"configuration {c['name']!r} appears in more than one sweep; rename one, "
                                     f"or pass --replace to keep its last measurement")
                # the later measurement, in the earlier one's place
                merged["configs"] = [c if m["name"] == c["name"] else m for m in merged["configs"]]
                merged["points"] = [p for p in merged["points"] if p["config"] != c["name"]]
            else:
                merged["configs"].append(c)
        merged["points"] += [p for p in r["points"] if p["config"] not in drop]
    s = merged["sweep"]
    s["concurrencies"] = sorted({p["concurrency"] for p in merged["points"]} | set(s["concurrencies"]))
    s["repeats"] = max(r["sweep"]["repeats"] for r in results)
    if tiers is not None:
        s["tiers"] = tiers
    if reference is not None:
        if reference not in [c["name"] for c in merged["configs"]]:
            raise BenchError(f"--reference {reference!r} is not a configuration of these sweeps")
        s["reference"] = reference
    return merged


class _LaunchedServer:
    """The URL of a configuration's server, started (and later stopped) when needed."""

    def __init__(self, server: ServerConfig, cfg: SweepConfig, entry: dict) -> None:
        self.server, self.cfg, self.entry = server, cfg, entry
        self.process: ServerProcess | None = None

    def __enter__(self) -> str:
        s, cfg = self.server, self.cfg
        if s.kind == "url":
            return s.url
        port = free_port()
        if s.kind == "dspark":
            spec = "none" if s.speculative is None else json.dumps(s.speculative)
            command: list[str] | str = dspark_serve_command(port, spec, cfg.server_args)
        else:
            command = s.command.replace("{port}", str(port))
        log_path = cfg.out_dir / "logs" / f"{s.name}.log"
        self.entry["log"] = str(log_path)
        self.entry["command"] = command if isinstance(command, str) else shlex.join(command)
        self.process = ServerProcess(command, f"http://127.0.0.1:{port}", log_path, cfg.server_timeout,
                                     cfg.grace_period)
        try:
            self.process.start()
        except ServerStartError as e:
            raise ServerStartError(f"configuration {s.name!r} did not start: {e}") from None
        finally:
            self.entry["pid"] = self.process.proc.pid if self.process.proc else None
        self.entry["startup_s"] = self.process.startup_s
        return self.process.url

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            self.process.stop()


def _run_point(name: str, url: str, concurrency: int, cfg: SweepConfig, pool: list, log) -> dict:
    n, warm = cfg.prompts_at(concurrency), cfg.warmups_at(concurrency)
    load = replace(cfg.load, base_url=url, max_concurrency=concurrency, num_prompts=n, num_warmups=warm,
                   metrics_url=None, request_rate=float("inf"))
    # The same prompts at the same point for every configuration.
    prompts = sample_prompts(pool, warm + n, cfg.load.seed + concurrency)
    runs = [run_benchmark(load, prompts) for _ in range(cfg.repeats)]
    point = aggregate_runs(name, concurrency, runs)
    acc = point["acceptance_length"]
    log(f"[{name}] concurrency {concurrency}: {_num(point['output_throughput'])} out tok/s, "
        f"{_num(point['per_user_tps'])} tok/s/user, TTFT {_num(point['ttft_ms'])} ms, "
        f"TPOT {_num(point['tpot_ms'])} ms, acceptance length {_num(acc)}, failed {point['failed']}")
    return point


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _get(result: dict, path: tuple[str, ...]) -> float | None:
    for key in path:
        if not isinstance(result, dict):
            return None
        result = result.get(key)
    return result if isinstance(result, (int, float)) else None


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def aggregate_runs(name: str, concurrency: int, runs: list[dict]) -> dict:
    """One sweep point from its repeated runs: the median of each figure over the
    runs that have it, and the (min, max) spread."""
    point: dict = {"config": name, "concurrency": concurrency, "repeats": len(runs),
                   "num_prompts": runs[0]["config"]["num_prompts"]}
    spread = {}
    for key, path in POINT_FIGURES.items():
        xs = [x for x in (_get(r, path) for r in runs) if x is not None]
        point[key] = _median(xs) if xs else None
        if len(xs) > 1:
            spread[key] = [min(xs), max(xs)]
    point["spread"] = spread
    point["pareto"] = False
    point["runs"] = runs
    return point


def mark_pareto(points: list[dict]) -> None:
    """`pareto` = no other point is at least as fast per user and at least as high in
    throughput, and better in one of the two (across all configurations)."""
    usable = [p for p in points if usable_point(p)]
    for p in points:
        p["pareto"] = usable_point(p) and not any(
            q is not p and q["per_user_tps"] >= p["per_user_tps"] and q["output_throughput"] >= p["output_throughput"]
            and (q["per_user_tps"] > p["per_user_tps"] or q["output_throughput"] > p["output_throughput"])
            for q in usable)


def tier_table(points: list[dict], tiers: list[float], names: list[str]) -> list[dict]:
    """Per tier and configuration: the best output throughput among points whose
    per-user tok/s reaches the tier (None when no point does)."""
    table = []
    for tier in sorted(tiers):
        best: dict[str, dict | None] = {}
        for name in names:
            ok = [p for p in points if p["config"] == name and usable_point(p) and p["per_user_tps"] >= tier]
            top = max(ok, key=lambda p: p["output_throughput"], default=None)
            best[name] = None if top is None else {"output_throughput": top["output_throughput"],
                                                   "concurrency": top["concurrency"],
                                                   "per_user_tps": top["per_user_tps"]}
        table.append({"tier": tier, "best": best})
    return table
