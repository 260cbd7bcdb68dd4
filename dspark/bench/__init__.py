"""Online benchmarks: a load generator for any OpenAI-compatible server and a sweep
over server configurations and concurrencies.

This package speaks HTTP only. It knows no engine, drafter or runtime: what it
measures comes from the streamed responses (latencies, token counts from `usage`)
and from the server's Prometheus `/metrics` (speculative-decoding counters, read
with `dspark:` or `vllm:` names), so the same code measures `dspark serve`, vLLM
or any other server. Prompts come from `dspark.data`'s held-out sets or a JSONL file.

- `dataset`: the prompts a run sends.
- `client`: one streamed request, timed chunk by chunk.
- `stats`: percentiles, latency summaries, goodput.
- `prometheus`: the metrics text parser and acceptance from counter deltas.
- `runner`: `run_benchmark`, the closed- or open-loop run that ties them together.
- `report`: the stdout table.
- `server_process`: a server started, health-checked and stopped as a subprocess.
- `sweep`: configurations x concurrencies in rounds that alternate the configurations;
  `sweep_servers`: the configurations and their servers; `rounds`: the round order,
  medians over rounds and ratios paired within rounds; `sweep_report` / `sweep_plots`:
  sweep.md (tiers, paired ratios, dominance) and the plots.
"""

from .runner import BenchError, LoadConfig, run_benchmark

__all__ = ["BenchError", "LoadConfig", "run_benchmark"]
