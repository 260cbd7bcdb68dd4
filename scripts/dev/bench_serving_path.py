"""What serving costs at one request: the same greedy decode served over HTTP and run
by the engine alone, in alternating rounds.

Two processes stay up side by side, each idle while the other works: a `dspark serve`
server and an engine worker (the same target, precision and speculative
configuration, no HTTP). Each round decodes the same chat prompt (`--max-tokens`,
`ignore_eos`, greedy) once in each, in alternating order, and records per token:

- `served`: the interval between consecutive streamed events as a minimal client sees
  them (raw socket reads, no JSON parsing until the end);
- `engine thread`: the server's own inter-token interval (the Prometheus histogram's
  sum / count over the round), which includes whatever the HTTP thread takes from
  the forward's cores but not the delivery;
- `alone`: the engine worker's interval between steps that emitted tokens.

served - engine thread is the delivery (the hand-off to the event loop, SSE framing,
detokenization, the client); engine thread - alone is what the HTTP side costs the
forward. Reports medians of the rounds and each round's gap.

    python3 scripts/dev/bench_serving_path.py [--model F.gguf] --rounds 8 --json out.json
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from dspark.bench.server_process import ServerProcess, dspark_serve_command, free_port

PROMPT = "Explain how a hash map works, with an example in Python."

WORKER = r"""
import json, sys, time
from dspark.engine.config import EngineConfig
from dspark.engine.config import parse_speculative_arg, resolve_speculative
from dspark.engine.engine import LLMEngine
from dspark.runtime.target import Target
from dspark.sampling import SamplingParams
dtype, spec, model = sys.argv[1], sys.argv[2], sys.argv[4]
t = Target.load(model, dtype=dtype, log=lambda line: None)
eng = LLMEngine(t, resolve_speculative(parse_speculative_arg(spec), t), EngineConfig())
ids = t.tokenizer.apply_chat_template([{"role": "user", "content": sys.argv[3]}])
print("ready", flush=True)
for line in sys.stdin:
    n = int(line)
    eng.add_request(ids, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
    stamps, tokens = [], 0
    while eng.has_unfinished():
        outs = eng.step()
        k = sum(len(o.new_tokens) for o in outs)
        if k:
            stamps.append(time.perf_counter())
            tokens += k
    print(json.dumps({"stamps": stamps, "tokens": tokens}), flush=True)
"""


def _served(host: str, port: int, max_tokens: int) -> dict:
    """One streamed chat completion over a raw socket: event arrival times."""
    body = json.dumps({"stream": True, "stream_options": {"include_usage": True}, "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True, "messages": [{"role": "user", "content": PROMPT}]}).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    stamps: list[float] = []
    raw = bytearray()
    with socket.create_connection((host, port)) as s:
        s.sendall(head + body)
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            n = chunk.count(b"data: {")
            if n:
                stamps.append(time.perf_counter())
            raw += chunk
    text = raw.decode("utf-8", "replace")
    usage = [json.loads(m) for m in re.findall(r'data: (\{.*"usage".*\})', text)]
    tokens = next((u["usage"]["completion_tokens"] for u in usage if u.get("usage")), None)
    if not stamps or tokens is None:
        raise RuntimeError(f"the server did not stream a reply with usage: {text[:600]}")
    return {"stamps": stamps, "tokens": tokens}


def _itl(url: str) -> tuple[float, float]:
    text = httpx.get(url + "/metrics", timeout=30).text
    out = []
    for name in ("dspark:inter_token_latency_seconds_sum", "dspark:inter_token_latency_seconds_count"):
        m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
        out.append(float(m.group(1)) if m else float("nan"))
    return out[0], out[1]


def _per_token(stamps: list[float], tokens: int) -> float:
    """ms per token between the first and the last emitting step (prefill excluded)."""
    return 1e3 * (stamps[-1] - stamps[0]) / max(1, tokens - 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--model", default="default", help="the target, for both sides (a name or a GGUF file)")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--speculative-config", default="none")
    ap.add_argument("--server-args", default="", help="extra `dspark serve` arguments, one string")
    ap.add_argument("--log", default="runs/serving_path_server.log")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = dspark_serve_command(port, args.speculative_config, ["--model", args.model, "--dtype", args.dtype,
                                                                     *args.server_args.split()])
    Path(args.log).parent.mkdir(parents=True, exist_ok=True)
    worker = subprocess.Popen([sys.executable, "-c", WORKER, args.dtype, args.speculative_config, PROMPT, args.model],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout.readline().strip() == "ready", "the engine worker did not start"
        with ServerProcess(cmd, url, args.log):
            _served("127.0.0.1", port, 8)  # warm both paths
            worker.stdin.write("8\n"); worker.stdin.flush(); worker.stdout.readline()
            rounds = []
            for r in range(args.rounds):
                row = {}
                for side in (("served", "alone") if r % 2 == 0 else ("alone", "served")):
                    if side == "served":
                        s0, c0 = _itl(url)
                        got = _served("127.0.0.1", port, args.max_tokens)
                        s1, c1 = _itl(url)
                        row["served"] = _per_token(got["stamps"], got["tokens"])
                        row["engine_thread"] = 1e3 * (s1 - s0) / max(1.0, c1 - c0)
                        row["served_events"] = len(got["stamps"])
                    else:
                        worker.stdin.write(f"{args.max_tokens}\n"); worker.stdin.flush()
                        got = json.loads(worker.stdout.readline())
                        row["alone"] = _per_token(got["stamps"], got["tokens"])
                    time.sleep(0.2)
                row["gap"] = row["served"] - row["alone"]
                rounds.append(row)
                print(f"round {r + 1}: served {row['served']:.2f} ms/token, engine thread "
                      f"{row['engine_thread']:.2f}, alone {row['alone']:.2f}, gap {row['gap']:+.2f}", flush=True)
    finally:
        worker.kill()
    med = {k: statistics.median(r[k] for r in rounds) for k in ("served", "engine_thread", "alone", "gap")}
    gaps = [r["gap"] for r in rounds]
    print(f"median of {len(rounds)} rounds: served {med['served']:.2f} ms/token, engine thread "
          f"{med['engine_thread']:.2f}, alone {med['alone']:.2f}; served - alone {med['gap']:+.2f} ms "
          f"[{min(gaps):+.2f} to {max(gaps):+.2f}]")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rounds": rounds, "median": med}, indent=1))


if __name__ == "__main__":
    main()
