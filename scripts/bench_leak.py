"""Timing-attack harness between two tenants (dspark.bench.leak): AUC of time to first
token, time per token and tokens per chunk, across namespaces and inside the victim's.

Starts `dspark serve` with two tenants and the server's default settings (or uses
--base-url, whose server must accept --victim-key and --attacker-key as different
tenants) and prints one JSON line per condition, then the verdict. The victim asks
again before every pair of probes, so the default 64 MiB prefix cache is large enough
for any number of probes (dspark.bench.leak). Run it on a quiet machine: other load
adds noise that hides the control's leak (an inconclusive run), never one across
namespaces.

    python scripts/bench_leak.py --probes 50 --out leak.json
    python scripts/bench_leak.py --server-args "--stream-chunk-tokens 4"
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from pathlib import Path

from dspark.bench.leak import CHATML, Client, LeakConfig, run_leak, verdict
from dspark.bench.server_process import ServerProcess, dspark_serve_command, free_port


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", help="a running server (default: start one)")
    ap.add_argument("--victim-key", default="victim-key")
    ap.add_argument("--attacker-key", default="attacker-key")
    ap.add_argument("--victim-salt", default=None, help="the victim's cache_salt (default: none)")
    ap.add_argument("--probes", type=int, default=50, help="probes per kind and condition (default: %(default)s)")
    ap.add_argument("--probe-tokens", type=int, default=32, help="tokens each probe decodes (default: %(default)s)")
    ap.add_argument("--reply-tokens", type=int, default=96, help="tokens of the victim's reply (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fetch-concurrency", type=int, default=8,
                    help="decoy replies fetched at once before the probes, untimed (default: %(default)s)")
    ap.add_argument("--template", default=CHATML,
                    help="the prompts' frame, with {request} (default: the default model's chat format)")
    ap.add_argument("--speculative-config", default="default",
                    help="for the started server (default: the server's own default)")
    ap.add_argument("--server-args", default="", help="more `dspark serve` arguments for the started server")
    ap.add_argument("--out", help="write the probes and AUCs as JSON here (beside it: the server's /metrics at the "
                                  "end as .metrics.txt, the started server's log as .server.log)")
    args = ap.parse_args()
    if args.probes < 5 or args.probe_tokens < 4 or args.reply_tokens < 8:
        ap.error("need --probes >= 5, --probe-tokens >= 4 and --reply-tokens >= 8")
    if "{request}" not in args.template:
        ap.error("--template must contain {request}")
    if args.victim_key == args.attacker_key:
        ap.error("--victim-key and --attacker-key must differ (two tenants)")
    cfg = LeakConfig(args.victim_key, args.attacker_key, args.victim_salt, args.probes, args.probe_tokens,
                     args.reply_tokens, args.seed, args.template, args.fetch_concurrency)
    if args.base_url:
        return report(args, run(args.base_url, cfg, args.out))
    with tempfile.TemporaryDirectory() as tmp:
        keys = Path(tmp) / "keys.txt"
        keys.write_text(f"{args.victim_key} victim\n{args.attacker_key} attacker\n")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        cmd = dspark_serve_command(port, args.speculative_config,
                                   ["--api-keys-file", str(keys), "--log-interval", "0",
                                    *shlex.split(args.server_args)])
        log = Path(args.out).with_suffix(".server.log") if args.out else Path(tmp) / "server.log"
        with ServerProcess(cmd, url, log):
            return report(args, run(url, cfg, args.out))


def run(url: str, cfg: LeakConfig, out: str | None = None):
    client = Client(url)
    try:
        results = run_leak(client, cfg, log=lambda line: print(line, file=sys.stderr, flush=True))
        if out:  # the server's state at the end (its step-time prices, governors, counters), for the record
            r = client.http.get(client.url + "/metrics", headers={"Authorization": f"Bearer {cfg.victim_key}"})
            if r.status_code == 200:
                Path(out).with_suffix(".metrics.txt").write_text(r.text)
        return results
    finally:
        client.close()


def report(args: argparse.Namespace, results) -> int:
    outcome = verdict(results)
    print(json.dumps({"verdict": outcome, "conditions": [r.summary() for r in results]}))
    if args.out:
        Path(args.out).write_text(json.dumps({
            "verdict": outcome, "args": vars(args),
            "conditions": [{**r.summary(), "probes": [vars(p) for p in r.probes]} for r in results]}, indent=1))
    return {"pass": 0, "fail": 1}.get(outcome, 2)


if __name__ == "__main__":
    sys.exit(main())
