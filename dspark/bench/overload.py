"""Overload `dspark serve` at a multiple of its measured capacity, then stop it with
SIGTERM under load, and check that it held.

1. Capacity: closed loop at --max-num-seqs concurrent requests for --capacity-s
   seconds; capacity = finished requests per second.
2. Overload: open-loop Poisson arrivals at --factor x capacity for --overload-s
   seconds. Every answer must be 200, or 429 with Retry-After and OpenAI's error
   body (the bounded waiting queue is full); nothing else, and no accepted request
   left unfinished. Latency of accepted requests is compared with the bound the
   queue sets: (max_waiting / max_num_seqs + 1) service times, plus one for luck.
3. Drain: with the batch and queue full, SIGTERM; in-flight requests finish (or end
   with an explicit error once --shutdown-timeout has passed) and the process exits
   within shutdown-timeout + 15 s.

    dspark bench overload --out runs/overload.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import httpx


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--speculative-config", default='{"method": "dspark", "enable_adaptive_verification": true}')
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--max-waiting", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--capacity-s", type=float, default=60)
    p.add_argument("--overload-s", type=float, default=120)
    p.add_argument("--factor", type=float, default=2.0, help="arrival rate / capacity (default: %(default)s)")
    p.add_argument("--shutdown-timeout", type=float, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    p.add_argument("--log", default="runs/overload-server.log")
    args = p.parse_args(argv)

    from dspark.bench.dataset import heldout_prompts
    from dspark.bench.server_process import ServerProcess, dspark_serve_command, free_port

    prompts = [p.chat_messages() for p in heldout_prompts("mixed", 48)]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = dspark_serve_command(port, args.speculative_config, [
        "--max-num-seqs", str(args.max_num_seqs), "--max-waiting", str(args.max_waiting),
        "--shutdown-timeout", str(args.shutdown_timeout), "--log-interval", "30"])
    Path(args.log).parent.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    report: dict = {"setup": {k: v for k, v in vars(args).items() if k not in ("out", "log")},
                    "command": "python " + " ".join(sys.argv)}
    with ServerProcess(cmd, url, args.log, startup_timeout=900) as server:
        report["startup_s"] = round(server.startup_s, 1)
        capacity, service_s = asyncio.run(measure_capacity(url, prompts, args, rng))
        report["capacity_rps"] = round(capacity, 3)
        report["service_s_median"] = round(service_s, 2)
        over = asyncio.run(overload(url, prompts, args, rng, capacity * args.factor))
        bound = (args.max_waiting / args.max_num_seqs + 2) * service_s
        over["latency_bound_s"] = round(bound, 1)
        over["latency_bounded"] = over["accepted_latency_s"]["max"] <= bound if over["accepted"] else True
        time.sleep(3)
        over["idle_gauges"] = idle_gauges(url)
        report["overload"] = over
        report["drain"] = asyncio.run(drain(url, prompts, args, rng, server.proc))
    o, d = report["overload"], report["drain"]
    report["held"] = (o["lost"] == 0 and o["unfinished"] == 0 and o["rejected_without_retry_after"] == 0
                      and o["latency_bounded"] and all(v == 0 for v in o["idle_gauges"].values())
                      and d["lost"] == 0 and d["exited_within_bound"])
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0 if report["held"] else 1


def body(prompts, args, rng) -> dict:
    return {"messages": rng.choice(prompts), "max_tokens": args.max_tokens, "temperature": 0, "ignore_eos": True}


async def measure_capacity(url, prompts, args, rng) -> tuple[float, float]:
    done, durations = 0, []
    end = time.monotonic() + args.capacity_s
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        async def worker() -> None:
            nonlocal done
            while time.monotonic() < end:
                t0 = time.monotonic()
                r = await client.post("/v1/chat/completions", json=body(prompts, args, rng))
                r.raise_for_status()
                durations.append(time.monotonic() - t0)
                done += 1

        t0 = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(args.max_num_seqs)))
        elapsed = time.monotonic() - t0
    return done / elapsed, statistics.median(durations)


async def overload(url, prompts, args, rng, rate: float) -> dict:
    statuses: Counter = Counter()
    latencies: list[float] = []
    lost: list[str] = []
    no_retry_after = 0

    async with httpx.AsyncClient(base_url=url, timeout=600, limits=httpx.Limits(max_connections=1000)) as client:
        async def one() -> None:
            nonlocal no_retry_after
            t0 = time.monotonic()
            try:
                r = await client.post("/v1/chat/completions", json=body(prompts, args, rng))
            except httpx.HTTPError as e:
                lost.append(f"{type(e).__name__}: {e}")
                return
            statuses[r.status_code] += 1
            if r.status_code == 200:
                latencies.append(time.monotonic() - t0)
            elif r.status_code == 429:
                if not r.headers.get("retry-after") or r.json().get("error", {}).get("code") != "queue_full":
                    no_retry_after += 1
            else:
                lost.append(f"status {r.status_code}: {r.text[:200]}")

        tasks = []
        end = time.monotonic() + args.overload_s
        while time.monotonic() < end:
            tasks.append(asyncio.ensure_future(one()))
            await asyncio.sleep(rng.expovariate(rate))
        await asyncio.gather(*tasks)
    accepted = len(tasks) - statuses[429] - len(lost)
    return {"arrival_rate_rps": round(rate, 3), "sent": len(tasks), "statuses": {str(k): v for k, v in statuses.items()},
            "accepted": accepted, "finished": statuses[200], "unfinished": accepted - statuses[200],
            "rejected_429": statuses[429], "rejected_without_retry_after": no_retry_after, "lost": len(lost),
            "lost_examples": lost[:5], "accepted_latency_s": _quantiles(latencies)}


async def drain(url, prompts, args, rng, proc) -> dict:
    """Fill the batch and the queue, SIGTERM, and watch every request end."""
    outcomes: Counter = Counter()
    lost: list[str] = []
    n = args.max_num_seqs + args.max_waiting
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        async def one() -> None:
            try:
                r = await client.post("/v1/chat/completions", json=body(prompts, args, rng))
            except httpx.HTTPError as e:
                lost.append(f"{type(e).__name__}: {e}")
                return
            if r.status_code == 200:
                outcomes["finished"] += 1
            elif r.status_code in (429, 503) or (r.status_code == 500 and "shutting down" in r.text):
                outcomes["clean_error"] += 1
            else:
                lost.append(f"status {r.status_code}: {r.text[:200]}")

        tasks = [asyncio.ensure_future(one()) for _ in range(n)]
        await asyncio.sleep(2.0)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        await asyncio.gather(*tasks)
        answered_s = time.monotonic() - t0
    try:
        exit_code = await asyncio.to_thread(proc.wait, args.shutdown_timeout + 60)
    except Exception:  # still running: the bound below fails
        exit_code = None
    exited_s = time.monotonic() - t0
    return {"in_flight_at_sigterm": n, "outcomes": dict(outcomes), "lost": len(lost), "lost_examples": lost[:5],
            "all_answered_s": round(answered_s, 1), "exited_s": round(exited_s, 1), "exit_code": exit_code,
            "exited_within_bound": exited_s <= args.shutdown_timeout + 15}


def idle_gauges(url: str) -> dict[str, float]:
    want = ("dspark:kv_slots_used", "dspark:spec_decode_drafter_requests", "dspark:num_requests_running",
            "dspark:num_requests_waiting")
    out = {}
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        name = line.split("{")[0]
        if name in want:
            out[name] = float(line.rpartition(" ")[2])
    return out


def _quantiles(xs: list[float]) -> dict:
    if not xs:
        return {}
    xs = sorted(xs)
    q = lambda f: round(xs[min(len(xs) - 1, int(f * len(xs)))], 2)  # noqa: E731
    return {"n": len(xs), "p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "max": round(xs[-1], 2)}


if __name__ == "__main__":
    sys.exit(main())
