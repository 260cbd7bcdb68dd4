"""Soak `dspark serve` on loopback with clients that misbehave, and check it held.

For each phase (a speculative config and a number of minutes), a server is started
and `--clients` concurrent clients send held-out prompts in a mix of behaviours:

  whole / stream      greedy or sampled, read to the end
  vanish-mid-stream   read a few events, then close the connection
  vanish-early        start a streamed request and drop it before the first token
  give-up             a whole request with a client timeout shorter than its generation
  at-limit            a prompt of max_model_len - 1 tokens and one output token (200)
  over-limit          a prompt of max_model_len tokens (400, context_length_exceeded)
  probe               a fixed greedy prompt, whose text must equal plain decoding

Every 10 s the server's /metrics and resident memory are sampled. At the end of a
phase, once idle: no KV slot and no drafter state held (the leak gauges are 0),
resident memory within --rss-bound of its level after warm-up, every request
answered or cleanly errored (none lost: no 5xx, no transport error we did not cause,
no stream without its end), and every probe equal to the plain reference computed
here with the same precision.

    dspark bench soak --phases 'default:14,none:7' --out runs/soak.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import httpx

BEHAVIOURS = {"whole": 20, "stream": 20, "vanish-mid-stream": 15, "vanish-early": 10, "give-up": 5,
              "at-limit": 5, "over-limit": 5, "probe": 20}
DISCONNECTING = ("vanish-mid-stream", "vanish-early", "give-up")
GAUGES = ("dspark:kv_slots_used", "dspark:spec_decode_drafter_requests", "dspark:num_requests_running",
          "dspark:num_requests_waiting")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--phases", default="default:14,none:7",
                   help="comma-separated SPEC:MINUTES; SPEC is 'default' (the shipped DSpark drafter, adaptive), "
                        "'none', or a --speculative-config JSON (default: %(default)s)")
    p.add_argument("--clients", type=int, default=6, help="concurrent clients (default: %(default)s)")
    p.add_argument("--max-model-len", type=int, default=512)
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--dtype", default="auto", help="server precision; auto is resolved here once and passed on")
    p.add_argument("--rss-bound", type=float, default=0.05, help="allowed resident-memory growth (default: 5%%)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the report as JSON here")
    p.add_argument("--log-dir", default="runs/soak", help="server logs and metric samples (default: %(default)s)")
    args = p.parse_args(argv)
    phases = []
    for item in args.phases.split(","):
        spec, _, minutes = item.rpartition(":")
        phases.append((spec, float(minutes)))

    from dspark.bench.dataset import heldout_prompts
    from dspark.engine.engine import EngineConfig, LLMEngine
    from dspark.runtime.target import Target
    from dspark.sampling import SamplingParams

    target = Target.load("default", dtype=args.dtype, max_len=args.max_model_len)
    precision = target.precision
    tok = target.tokenizer
    prompts = [p.chat_messages() for p in heldout_prompts("mixed", 48)]
    probes = [tok.apply_chat_template(m) for m in prompts[:6]]
    plain = LLMEngine(target, None, EngineConfig(max_num_seqs=8, max_model_len=args.max_model_len))
    reference = [plain.final_text(s) for s in plain.generate(probes, SamplingParams(temperature=0, max_tokens=32))]
    filler = tok.encode(" ".join(f"item {i}" for i in range(2000)))
    del plain, target

    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    report = {"setup": {"phases": args.phases, "clients": args.clients, "max_model_len": args.max_model_len,
                        "max_num_seqs": args.max_num_seqs, "precision": precision, "rss_bound": args.rss_bound,
                        "behaviour_weights": BEHAVIOURS, "command": "python " + " ".join(sys.argv)},
              "phases": []}
    ok = True
    for i, (spec, minutes) in enumerate(phases):
        res = run_phase(spec, minutes, args, precision, prompts, probes, reference, filler, log_dir / f"phase{i}")
        report["phases"].append(res)
        ok = ok and res["held"]
        print(json.dumps(res, indent=2), flush=True)
    report["held"] = ok
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return 0 if ok else 1


def run_phase(spec: str, minutes: float, args, precision: str, prompts, probes, reference, filler,
              log_prefix: Path) -> dict:
    from dspark.bench.server_process import ServerProcess, dspark_serve_command, free_port

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    spec_arg = json.dumps({"method": "dspark", "enable_adaptive_verification": True}) if spec == "default" else spec
    cmd = dspark_serve_command(port, spec_arg, ["--dtype", precision, "--max-model-len", str(args.max_model_len),
                                                "--max-num-seqs", str(args.max_num_seqs), "--log-interval", "30"])
    with ServerProcess(cmd, url, log_prefix.with_suffix(".log"), startup_timeout=900) as server:
        pid = server.proc.pid
        state = Soak(url, args, prompts, probes, reference, filler, random.Random(args.seed))
        samples = asyncio.run(state.run(minutes * 60, pid, log_prefix.with_suffix(".samples.jsonl")))
        time.sleep(3)
        idle = scrape(url)
        rss_end = rss_mib(pid)
    warm = [s["rss_mib"] for s in samples if 120 <= s["t"] <= 240] or [samples[0]["rss_mib"]]
    base = statistics.median(warm)
    growth = rss_end / base - 1
    counts = state.outcomes
    total = sum(state.behaviours.values())
    leaked = {g: idle.get(g, float("nan")) for g in GAUGES}
    lost = counts["lost"]
    held = (lost == 0 and all(v == 0 for v in leaked.values()) and growth <= args.rss_bound
            and state.probe_mismatches == 0 and state.probes_checked > 0)
    return {"speculative_config": spec, "minutes": minutes, "requests": total,
            "behaviours": dict(state.behaviours), "outcomes": dict(counts),
            "disconnecting_share": round(sum(state.behaviours[b] for b in DISCONNECTING) / max(total, 1), 3),
            "lost_examples": state.lost_examples[:10], "idle_gauges": leaked,
            "max_gauges": {g: max(s.get(g, 0) for s in samples) for g in GAUGES},
            "rss_mib_after_warmup": round(base, 1), "rss_mib_end": round(rss_end, 1),
            "rss_growth": round(growth, 4), "probes_checked": state.probes_checked,
            "probe_mismatches": state.probe_mismatches, "generation_tokens": idle.get("dspark:generation_tokens_total"),
            "drafter_errors": idle.get("dspark:spec_decode_drafter_errors_total"), "held": held}


class Soak:
    def __init__(self, url, args, prompts, probes, reference, filler, rng: random.Random) -> None:
        self.url = url
        self.args = args
        self.prompts = prompts
        self.probes = probes
        self.reference = reference
        self.filler = filler
        self.rng = rng
        self.behaviours: Counter = Counter()
        self.outcomes: Counter = Counter()
        self.lost_examples: list[str] = []
        self.probes_checked = 0
        self.probe_mismatches = 0

    async def run(self, seconds: float, pid: int, samples_path: Path) -> list[dict]:
        end = time.monotonic() + seconds
        samples: list[dict] = []
        async with httpx.AsyncClient(base_url=self.url, timeout=300,
                                     limits=httpx.Limits(max_connections=4 * self.args.clients)) as client:
            async def sampler() -> None:
                t0 = time.monotonic()
                with samples_path.open("w") as f:
                    while time.monotonic() < end:
                        m = await asyncio.to_thread(scrape, self.url)
                        s = {"t": round(time.monotonic() - t0, 1), "rss_mib": rss_mib(pid),
                             **{g: m.get(g) for g in GAUGES}, "requests": sum(self.behaviours.values()),
                             "lost": self.outcomes["lost"]}
                        samples.append(s)
                        f.write(json.dumps(s) + "\n")
                        f.flush()
                        await asyncio.sleep(10)

            async def worker() -> None:
                while time.monotonic() < end:
                    await self.one(client)

            await asyncio.gather(sampler(), *(worker() for _ in range(self.args.clients)))
        return samples

    def lose(self, behaviour: str, what: str) -> None:
        self.outcomes["lost"] += 1
        self.lost_examples.append(f"{behaviour}: {what}"[:300])

    async def one(self, client: httpx.AsyncClient) -> None:
        rng = self.rng
        b = rng.choices(list(BEHAVIOURS), weights=list(BEHAVIOURS.values()))[0]
        self.behaviours[b] += 1
        sampled = rng.random() < 0.4
        body: dict = {"messages": rng.choice(self.prompts), "max_tokens": rng.randint(8, 48),
                      "temperature": 0.8 if sampled else 0, "seed": rng.randint(0, 2**31)}
        try:
            if b == "whole":
                r = await client.post("/v1/chat/completions", json=body)
                self.expect(b, r, 200)
            elif b == "stream":
                await self.stream(client, b, body, read_events=None)
            elif b == "vanish-mid-stream":
                await self.stream(client, b, body, read_events=rng.randint(1, 4))
            elif b == "vanish-early":
                task = asyncio.ensure_future(self.stream(client, b, body, read_events=0))
                await asyncio.sleep(rng.uniform(0.0, 0.05))
                if not task.done():  # else it counted its own outcome
                    task.cancel()
                    try:
                        await task
                    except asyncio.CancelledError:
                        pass
                    self.outcomes["vanished"] += 1
            elif b == "give-up":
                try:
                    await client.post("/v1/chat/completions", json={**body, "max_tokens": 200, "ignore_eos": True},
                                      timeout=rng.uniform(0.3, 1.5))
                    self.outcomes["answered"] += 1  # it was quicker than the client's patience
                except httpx.TimeoutException:
                    self.outcomes["vanished"] += 1
            elif b in ("at-limit", "over-limit"):
                n = self.args.max_model_len - (1 if b == "at-limit" else 0)
                r = await client.post("/v1/completions", json={"prompt": self.filler[:n], "max_tokens": 1,
                                                               "temperature": 0})
                self.expect(b, r, 200 if b == "at-limit" else 400)
            else:  # probe
                i = rng.randrange(len(self.probes))
                r = await client.post("/v1/completions", json={"prompt": self.probes[i], "max_tokens": 32,
                                                               "temperature": 0})
                if self.expect(b, r, 200):
                    self.probes_checked += 1
                    if r.json()["choices"][0]["text"] != self.reference[i]:
                        self.probe_mismatches += 1
                        self.lost_examples.append(f"probe {i} differs from plain decoding")
        except (httpx.TransportError, httpx.HTTPStatusError) as e:
            self.lose(b, f"{type(e).__name__}: {e}")

    def expect(self, behaviour: str, r: httpx.Response, status: int) -> bool:
        if r.status_code == status:
            self.outcomes["answered" if status == 200 else "clean_error"] += 1
            return True
        if r.status_code in (429, 503) and "error" in r.json():
            self.outcomes["clean_error"] += 1
            return False
        self.lose(behaviour, f"status {r.status_code} (expected {status}): {r.text[:200]}")
        return False

    async def stream(self, client: httpx.AsyncClient, behaviour: str, body: dict, read_events: int | None) -> None:
        async with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
            if r.status_code != 200:
                await r.aread()
                self.expect(behaviour, r, 200)
                return
            seen = 0
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    self.outcomes["answered"] += 1
                    return
                seen += 1
                if read_events is not None and seen >= max(read_events, 1):
                    self.outcomes["vanished"] += 1
                    return  # leaving the block closes the connection mid-stream
            if read_events is None:
                self.lose(behaviour, "the stream ended without [DONE]")
            else:
                self.outcomes["answered"] += 1


def scrape(url: str) -> dict[str, float]:
    out = {}
    try:
        text = httpx.get(url + "/metrics", timeout=30).text
    except httpx.HTTPError:
        return out
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name.split("{")[0] if "model_name=" in name and name.count("=") == 1 else name] = float(value)
    return out


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


if __name__ == "__main__":
    sys.exit(main())
