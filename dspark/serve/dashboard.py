"""The live view: a dashboard at `/` and a race at `/race`, served from the package.

The pages are static files (`static/`, no script from elsewhere); `GET
/dashboard/config` tells them whether a key is needed, and their data comes from two
routes closed by the API key when the API is:

- `GET /dashboard/state?since=T`: one small JSON object the dashboard polls about
  once a second. On a server of several tenants, a caller's steps are their own
  requests' (others' as a count): see `_own_steps`. It only reads what the engine thread already keeps (counters,
  gauges, the calibration figures refreshed with /metrics, the ring buffer of recent
  steps, filtered to those that ended after `since`), so an open page costs the
  engine a few dictionary reads per second and no walk over any window.
- `POST /dashboard/race`: the race (see `race.py`), streamed as server-sent events.
"""

from __future__ import annotations

import math
import time
from importlib import resources

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from .protocol import APIError, bad_request

#: the files the pages are made of, with their media types; nothing else is served
STATIC_FILES = {"dashboard.html": "text/html", "race.html": "text/html", "live.css": "text/css",
                "charts.js": "text/javascript", "dashboard.js": "text/javascript", "race.js": "text/javascript",
                "common.js": "text/javascript"}


def _static(name: str) -> Response:
    body = resources.files(__package__).joinpath("static", name).read_bytes()
    return Response(body, media_type=STATIC_FILES[name] + "; charset=utf-8", headers={"Cache-Control": "no-cache"})


def _finite(x: float) -> float | None:
    return None if x is None or math.isnan(x) or math.isinf(x) else round(float(x), 5)


def engine_info(engine) -> dict:
    """What does not change while serving: the model, the speculation set-up, the step-time table."""
    spec = engine.spec if engine.runner.drafter is not None else None
    table = engine.step_table
    info = {"speculative": None, "table": None}
    if spec is not None:
        info["speculative"] = {"method": spec.method, "policy": engine.policy.__class__.__name__,
                               "policy_name": spec.policy, "num_speculative_tokens": engine.runner.num_speculative_tokens}
    if table is not None:
        info["table"] = {"tokens": table.token_counts, "ms": [round(t, 3) for t in table.step_ms]}
        if table.drafter is not None:
            info["table"]["drafter"] = {"requests": table.drafter.request_counts,
                                        "ms": [round(t, 3) for t in table.drafter.step_ms]}
    return info


def dashboard_state(state, since: float | None = None, viewer: str | None = None) -> dict:
    """The dashboard's figures now; `steps` holds the recent steps that ended after
    `since` (server monotonic seconds, as `now` reports it). With a `viewer` (a tenant,
    on a server of several) only the steps that decoded a request of theirs, each
    reduced to their own requests' part, with the others' as a count (`_own_steps`)."""
    m = state.metrics
    out: dict = {"now": time.monotonic(), "phase": state.phase, "model": state.names[0]}
    if not state.ready:
        return out
    engine = state.engine
    runner, watch = engine.runner, engine.step_watch
    out.update(engine_info(engine))
    out["running"] = int(m.running.value())
    out["waiting"] = int(m.waiting.value())
    out["max_num_seqs"] = engine.config.max_num_seqs
    out["totals"] = {"generation_tokens": m.generation_tokens.value(), "prompt_tokens": m.prompt_tokens.value(),
                     "drafts": m.num_drafts.value(), "draft_tokens": m.num_draft_tokens.value(),
                     "accepted_tokens": m.num_accepted_tokens.value()}
    out["calibration"] = {"ece": _finite(m.calibration_ece.value()),
                          "positions": [{"position": k, "predicted": round(p, 4), "observed": round(o, 4),
                                         "trials": n} for k, (p, o, n) in m.calibration_positions.items()]}
    import torch  # loaded already: the engine runs on it

    out["events"] = {"drafter_skips": getattr(engine.policy, "skipped_steps", 0),
                     "request_skips": runner.gate.skipped,
                     "drafter_faults": runner.drafter_errors,
                     "thread_fallbacks": watch.fallbacks if watch is not None else 0,
                     "slow_windows": watch.slow_windows if watch is not None else 0,
                     "table_refreshes": watch.refreshes if watch is not None else 0,
                     "threads": torch.get_num_threads(),
                     "threads_wanted": watch.threads if watch is not None else torch.get_num_threads()}
    gov = engine.speculate_or_plain
    # the plain-decoding fallback's call per load level (None: not configured); the
    # levels' modes are "speculative" and "plain"
    out["fallback"] = None if gov is None else {
        "from_requests": gov.from_requests,
        "levels": [{"requests": level, **st} for level, st in gov.summary().items()]}
    # where a step speculates: the drafter on or off, the modes named in "drafter_modes"
    # ("drafter" and "lookup" with hybrid drafting, "drafter" and "plain" for a drafter alone)
    dgov = getattr(engine, "drafter_or_lookup", None)
    if out["fallback"] is not None and dgov is not None:
        out["fallback"]["drafter_modes"] = list(dgov.modes.values())
        out["fallback"]["drafter_levels"] = [{"requests": level, **st} for level, st in dgov.summary().items()]
    steps = engine.recent_steps.copy()  # one C-level copy: the engine thread appends meanwhile
    cut = -math.inf if since is None else since
    # filtered on the rounded end the page sends back, or the last step would come again
    if viewer is not None:
        out["steps"] = _own_steps(steps, cut, viewer)
        out["view"] = "own requests"
        return out
    out["steps"] = [[end, round(r.seconds * 1000, 3), r.forward_tokens, r.drafted_requests, r.emitted_tokens,
                     list(r.verify_lengths)] for r in steps if (end := round(r.end, 4)) > cut]
    return out


def _own_steps(steps, cut: float, viewer: str) -> list[list]:
    """The steps that decoded a request of `viewer`'s, in the rows' layout (end, ms,
    forward tokens, drafted requests, emitted tokens, verification lengths) counting
    only theirs, plus the number of others' requests in the step. The others' drafts,
    verification lengths and emitted tokens are theirs to see: each one tells how
    much of a reply was drafted, and with lookup where some earlier text held it."""
    rows = []
    for r in steps:
        end = round(r.end, 4)
        if end <= cut or viewer not in r.owners:
            continue
        mine = [i for i, o in enumerate(r.owners) if o == viewer]
        lengths = [r.verify_lengths[i] for i in mine]
        rows.append([end, round(r.seconds * 1000, 3), sum(lengths) + len(lengths), sum(L > 0 for L in lengths),
                     sum(r.emitted[i] for i in mine), lengths, len(r.owners) - len(mine)])
    return rows


def add_live_routes(app: FastAPI, state, require_api_key) -> None:
    """The pages (open: they hold no data) and their data routes (behind the key)."""

    @app.get("/", include_in_schema=False)
    async def dashboard_page() -> Response:
        return _static("dashboard.html")

    @app.get("/race", include_in_schema=False)
    async def race_page() -> Response:
        return _static("race.html")

    @app.get("/static/{name}", include_in_schema=False)
    async def static_file(name: str) -> Response:
        if name not in STATIC_FILES:
            raise APIError(404, f"no such file: /static/{name}", code="unknown_url")
        return _static(name)

    @app.get("/dashboard/config")
    async def live_config() -> dict:
        # open, so that a page learns it needs the key without a failed request
        return {"key_required": state.tenants.required, "model": state.names[0]}

    @app.get("/dashboard/state", dependencies=[Depends(require_api_key)])
    async def live_state(request: Request) -> JSONResponse:
        raw = request.query_params.get("since")
        try:
            since = None if raw is None else float(raw)
        except ValueError:
            raise bad_request(f"'since' must be a number (the 'now' of an earlier answer), got {raw!r}",
                              "since") from None
        viewer = None if state.tenants.shared else request.state.tenant
        return JSONResponse(dashboard_state(state, since, viewer), headers={"Cache-Control": "no-store"})

    @app.post("/dashboard/race", dependencies=[Depends(require_api_key)])
    async def race(request: Request):
        from .race import start_race

        state.require_ready()
        return await start_race(request, state)
