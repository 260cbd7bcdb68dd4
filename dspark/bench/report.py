"""The readable table `dspark bench serve` prints."""

from __future__ import annotations

from .stats import percentile_key

WIDTH = 56
# result key, section title, row label
SECTIONS = (("per_user_tps", "Per-user speed (1/TPOT)", "per-user tok/s"),
            ("ttft_ms", "Time to First Token", "TTFT (ms)"),
            ("tpot_ms", "Time per Output Token (excl. 1st token)", "TPOT (ms)"),
            ("itl_ms", "Inter-token Latency (per chunk)", "ITL (ms)"),
            ("e2el_ms", "End-to-end Latency", "E2EL (ms)"))


def _fmt(x: float | int | None, digits: int = 2) -> str:
    if x is None:
        return "-"
    if isinstance(x, int):
        return str(x)
    return f"{x:.{digits}f}"


def _row(label: str, value: str) -> str:
    return f"{label:<{WIDTH - 16}}{value:>16}"


def _section(title: str) -> str:
    return f"{' ' + title + ' ':-^{WIDTH}}"


def format_result(result: dict) -> str:
    cfg = result["config"]
    lines = [f"{' Serving Benchmark Result ':=^{WIDTH}}",
             f"Server: {cfg['base_url']} ({cfg['endpoint']}), model {cfg['model']}",
             f"Load: max concurrency {cfg['max_concurrency'] or 'unbounded'}, request rate "
             f"{cfg['request_rate']} req/s, max tokens {cfg['max_tokens']}",
             _row("Successful requests", _fmt(result["completed"])),
             _row("Failed requests", _fmt(result["failed"])),
             _row("Benchmark duration (s)", _fmt(result["duration_s"])),
             _row("Total input tokens", _fmt(result["total_input_tokens"])),
             _row("Total generated tokens", _fmt(result["total_output_tokens"])),
             _row("Request throughput (req/s)", _fmt(result["request_throughput"])),
             _row("Output token throughput (tok/s)", _fmt(result["output_throughput"])),
             _row("Total token throughput (tok/s)", _fmt(result["total_token_throughput"]))]
    if result.get("goodput"):
        g = result["goodput"]
        lines.append(_row("Request goodput (req/s)", _fmt(g["request_goodput"])))
        lines.append("  SLOs: " + ", ".join(f"{k} <= {v:g} ms" for k, v in g["slo_ms"].items())
                     + f"; {g['good_requests']} requests met them")
    lines.append(_row("Mean tokens per streamed chunk", _fmt(result["mean_tokens_per_chunk"])))
    if result["completed"] and not result["output_tokens_from_usage"]:
        lines.append("  note: the server sent no usage; tokens were counted as text chunks, which "
                     "undercounts a server that sends several tokens per chunk")
    lines.append(_row("Peak concurrent requests", _fmt(result["max_concurrent_requests"])))
    p_keys = [percentile_key(p) for p in cfg["percentiles"]]
    for key, title, short in SECTIONS:
        lines.append(_section(title))
        for stat in ("mean", "median", *p_keys):
            lines.append(_row(f"{stat.capitalize()} {short}", _fmt(result[key].get(stat))))
    lines.append(_section("Speculative Decoding"))
    spec = result.get("spec_decode")
    if spec is None:
        why = "no /metrics" if not result.get("metrics_available") else "no spec-decode counters"
        lines.append(_row("Acceptance", why))
    elif spec.get("error"):
        lines.append(spec["error"])
    else:
        lines += [_row("Drafts (verification rounds)", _fmt(spec["num_drafts"], 0)),
                  _row("Draft tokens / accepted", f"{spec['num_draft_tokens']:.0f} / {spec['num_accepted_tokens']:.0f}"),
                  _row("Acceptance length (accepted/draft + 1)", _fmt(spec["acceptance_length"])),
                  _row("Draft acceptance rate", _fmt(spec["acceptance_rate"], 3))]
        if spec["per_position_acceptance"]:
            lines.append("Per-position acceptance: " + " ".join(f"{a:.3f}" for a in spec["per_position_acceptance"]))
    if result["errors"]:
        lines.append(_section("Errors"))
        lines += [f"{n} x {msg}" for msg, n in result["errors"].items()]
    lines.append("=" * WIDTH)
    return "\n".join(lines)
