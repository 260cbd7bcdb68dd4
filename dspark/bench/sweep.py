"""`run_sweep`: every server configuration at every concurrency of a ladder, in
rounds that alternate the configurations (`rounds.py`), so that the machine's drift
cannot pass for a difference between them.

By default every configuration's server is started first (one after another, each
waited for on `/health`) and all stay up together; each round then measures every
concurrency, the configurations taking turns at each one (round r starts at
configuration r mod n). With `together=False` (servers that do not fit in memory
side by side), each configuration's server is started for its turn in every round,
runs all its concurrencies and is stopped. A configuration that fails to start, or
whose every warm-up request fails, is recorded with its error and left out of the
later turns; the sweep goes on with the others.

Each point (configuration x concurrency) is measured once per round; the report
gives its median over rounds and the (min, max) spread, and each configuration as a
multiple of the reference, ratio taken within each round (paired), with the median
and spread of those ratios. The per-user speed of a point is the median over its
requests of 1/TPOT (`stats.py`); SLA tiers keep, for each configuration, the
highest output throughput among its points whose per-user speed reaches the tier.
"""

from __future__ import annotations

import copy
import sys
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

from .dataset import DatasetError, heldout_prompts, jsonl_prompts, sample_prompts
from .rounds import (POINT_FIGURES, Visit, aggregate_runs, figure, ratio_table, round_order, round_visits,
                     usable_point)
from .provenance import provenance
from .runner import BenchError, LoadConfig, run_benchmark
from .server_process import ServerStartError
from .sweep_report import reference_name, sweep_rounds, write_outputs
from .sweep_servers import DEFAULT_CONFIGS, KNOWN_CONFIGS, LaunchedServer, ServerConfig, parse_server_config

__all__ = ["DEFAULT_CONFIGS", "KNOWN_CONFIGS", "ServerConfig", "SweepConfig", "merge_results", "parse_server_config",
           "run_sweep", "write_report"]

#: prompts of round r at concurrency c are drawn with seed + c + ROUND_SEED_STEP * r from that
#: point's own share of the pool (`point_pools`): every configuration gets the same prompts at
#: a point, and no other point of the run meets them where the dataset has enough
ROUND_SEED_STEP = 100_003


@dataclass
class SweepConfig:
    out_dir: Path
    configs: list[ServerConfig]
    concurrencies: list[int]
    #: the load of every point; base_url, max_concurrency, num_prompts and num_warmups are set per point
    load: LoadConfig
    tiers: list[float] = field(default_factory=list)
    #: each point is measured once per round; ratios are paired within rounds
    rounds: int = 3
    #: all servers up at once (True) or each started for its turn in every round (False)
    together: bool = True
    #: prompts per point; None = max(16, 4 x concurrency)
    num_prompts: int | None = None
    #: warm-up requests per point; None = the concurrency
    num_warmups: int | None = None
    server_args: list[str] = field(default_factory=list)
    server_timeout: float = 900.0
    grace_period: float = 30.0
    #: the configuration others are compared with in the report (None: `none`, else the first)
    reference: str | None = None
    #: the command line that ran the sweep, kept in sweep.json's provenance
    command: str | None = None

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
        if self.rounds < 1:
            raise BenchError(f"--rounds must be >= 1, got {self.rounds}")
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
        return {"concurrencies": self.concurrencies, "tiers": self.tiers, "rounds": self.rounds,
                "servers": "together" if self.together else "one at a time",
                "num_prompts": self.num_prompts or "max(16, 4 x concurrency)",
                "num_warmups": "concurrency" if self.num_warmups is None else self.num_warmups,
                "server_args": self.server_args, "server_timeout_s": self.server_timeout, "load": load,
                "reference": self.reference}


def run_sweep(cfg: SweepConfig, log=None) -> dict:
    """Run the sweep, writing sweep.json, sweep.md and the plots into `cfg.out_dir`
    after every round (the plots at the end); returns what sweep.json holds."""

    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    needs = {c: cfg.warmups_at(c) + cfg.prompts_at(c) for c in cfg.concurrencies}
    try:
        pool = (jsonl_prompts(cfg.load.dataset_path) if cfg.load.dataset_path
                else heldout_prompts(cfg.load.dataset, cfg.rounds * sum(needs.values())))
    except DatasetError as e:
        raise BenchError(str(e)) from None
    pools, repeats = point_pools(pool, cfg.rounds, needs)
    if repeats != "none":
        log(f"warning: {len(pool)} prompts are too few for {cfg.rounds * sum(needs.values())} without repeats: "
            f"prompts repeat {repeats} (a server's prefix cache or reply history may hit; fewer "
            f"--num-prompts, --rounds or concurrencies avoid it)")
    sweep_id = uuid.uuid4().hex[:12]
    entries = {s.name: {**s.describe(), "status": "ok", "error": None, "startup_s": None, "log": None}
               for s in cfg.configs}
    result = {"sweep": {**cfg.describe(), "id": sweep_id, "prompt_repeats": repeats,
                        "provenance": provenance(cfg.command)},
              "configs": list(entries.values()), "points": [],
              "tiers": [], "ratios": [], "order": []}
    servers = {s.name: LaunchedServer(s, entries[s.name], cfg.out_dir / "logs", cfg.server_args,
                                      cfg.server_timeout, cfg.grace_period) for s in cfg.configs}
    runs: dict[tuple[str, int], list[dict]] = {}
    live = [s.name for s in cfg.configs]

    def fail(name: str, error: Exception) -> None:
        entries[name]["status"], entries[name]["error"] = "failed", str(error)
        live.remove(name)
        servers[name].stop()
        log(f"[{name}] FAILED: {error}")

    def measure(visit: Visit) -> bool:
        try:
            run = _run_point(visit, servers[visit.config].url, cfg, pools, log)
        except BenchError as e:
            fail(visit.config, e)
            return False
        runs.setdefault((visit.config, visit.concurrency), []).append(run)
        result["order"].append([visit.round, visit.config, visit.concurrency])
        return True

    def start(name: str, log_name: str | None = None) -> bool:
        s = servers[name].server
        log(f"[{name}] starting" if s.kind != "url" else f"[{name}] using {s.url}")
        try:
            servers[name].start(log_name)
        except (ServerStartError, BenchError) as e:
            fail(name, e)
            return False
        return True

    try:
        if cfg.together:
            for name in list(live):
                start(name)
        for r in range(cfg.rounds):
            if cfg.together:
                for visit in round_visits(live, cfg.concurrencies, r, together=True):
                    if visit.config in live:  # not failed earlier in this round
                        measure(visit)
            else:
                for name in round_order(list(live), r):
                    if start(name, f"{name}.round{r}"):
                        for c in cfg.concurrencies:
                            if not measure(Visit(r, name, c)):
                                break
                        servers[name].stop()
            result["points"] = _points(cfg, runs, sweep_id)
            write_report(result, cfg.out_dir, plots=False)  # an interrupted sweep keeps its finished rounds
    finally:
        for server in servers.values():
            server.stop()
    result["points"] = _points(cfg, runs, sweep_id)
    write_report(result, cfg.out_dir)
    return result


def _points(cfg: SweepConfig, runs: dict[tuple[str, int], list[dict]], sweep_id: str) -> list[dict]:
    """The points measured so far, by configuration then concurrency."""
    return [aggregate_runs(s.name, c, runs[s.name, c], sweep_id)
            for s in cfg.configs for c in cfg.concurrencies if runs.get((s.name, c))]


def write_report(result: dict, out_dir: Path, plots: bool = True) -> None:
    """Recompute the Pareto marks, the tier table and the ratios of `result`, then write
    it (the plots too with `plots`)."""
    result["tiers"] = tier_table(result["points"], result["sweep"]["tiers"], [c["name"] for c in result["configs"]])
    mark_pareto(result["points"])
    ref = reference_name(result)
    result["ratios"] = ratio_table([p for p in result["points"] if usable_point(p)], ref) if ref else []
    write_outputs(result, out_dir, plots)


#: load settings that must agree for points of several sweeps to be compared
_COMPARABLE = ("dataset", "dataset_path", "endpoint", "max_tokens", "temperature", "ignore_eos", "seed")


def _measured_by(result: dict) -> tuple:
    prov = result["sweep"].get("provenance") or {}
    return prov.get("commit"), prov.get("dirty"), (prov.get("cpu") or {}).get("kind")


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
    s["rounds"] = max(sweep_rounds(r["sweep"]) for r in results)
    s.pop("repeats", None)
    kinds = {r["sweep"].get("prompt_repeats") for r in results}
    s["prompt_repeats"] = kinds.pop() if len(kinds) == 1 else None  # several kinds: the report says nothing
    s.pop("id", None)  # points keep their own sweep's id: only those of one sweep are paired
    if any(_measured_by(r) != _measured_by(first) for r in results):
        s.pop("provenance", None)  # several commits or CPUs: no one provenance (`bench record` refuses it)
    if tiers is not None:
        s["tiers"] = tiers
    if reference is not None:
        if reference not in [c["name"] for c in merged["configs"]]:
            raise BenchError(f"--reference {reference!r} is not a configuration of these sweeps")
        s["reference"] = reference
    return merged




def point_pools(pool: list, rounds: int, needs: dict[int, int]) -> tuple[dict[tuple[int, int], list], str]:
    """Each (round, concurrency) point's share of the prompt pool, and what repeats.

    A server that keeps recent prompts (our prefix cache and reply history, llama.cpp's
    slots) must not meet a prompt twice in a run: while the pool holds every point's
    `needs[c]` (warm-ups + measured), every point of every round gets a slice no other
    point has ("none" repeat). A smaller pool gives each round its own share for all its
    concurrencies ("across concurrencies"), and a pool too small for that is shared by
    every point ("across rounds")."""
    total = rounds * sum(needs.values())
    if len(pool) >= total:
        out, at = {}, 0
        for r in range(rounds):
            for c in sorted(needs):
                out[r, c] = pool[at: at + needs[c]]
                at += needs[c]
        return out, "none"
    share = len(pool) // max(rounds, 1)
    if share >= max(needs.values()):
        return {(r, c): pool[r * share: (r + 1) * share] for r in range(rounds) for c in needs}, "across concurrencies"
    return {(r, c): pool for r in range(rounds) for c in needs}, "across rounds"


def _run_point(visit: Visit, url: str, cfg: SweepConfig, pools: dict, log) -> dict:
    c = visit.concurrency
    n, warm = cfg.prompts_at(c), cfg.warmups_at(c)
    load = replace(cfg.load, base_url=url, max_concurrency=c, num_prompts=n, num_warmups=warm,
                   metrics_url=None, request_rate=float("inf"))
    prompts = sample_prompts(pools[visit.round, c], warm + n, cfg.load.seed + c + ROUND_SEED_STEP * visit.round)
    run = run_benchmark(load, prompts)
    run["round"] = visit.round
    f = {key: _num(figure(run, POINT_FIGURES[key])) for key in
         ("output_throughput", "per_user_tps", "ttft_ms", "tpot_ms", "acceptance_length")}
    log(f"[round {visit.round + 1}/{cfg.rounds}] [{visit.config}] concurrency {c}: {f['output_throughput']} out "
        f"tok/s, {f['per_user_tps']} tok/s/user, TTFT {f['ttft_ms']} ms, TPOT {f['tpot_ms']} ms, acceptance "
        f"length {f['acceptance_length']}, failed {run['failed']}")
    return run


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


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
