// The dashboard: polls /dashboard/state once a second and redraws.
"use strict";

const HISTORY_S = 120;   // seconds of history in the time charts
const RATE_S = 3;        // window of the tok/s tile
const AL_WINDOW_S = 5;   // window of one mean-acceptance-length point
const MAX_STEPS = 512;   // recent steps kept for the step and verification charts
const COLORS = { a: "#0b6bcb", b: "#bc4c00", c: "#1a7f37", d: "#8250df", grey: "#8c959f" };

const samples = [];      // {t, gen, drafts, accepted, running, waiting}
let steps = [];          // [end, ms, forwardTokens, draftedRequests, emitted, [verifyLengths]]
let lastStepEnd = null;
let info = null;
const eventSeen = {};    // name -> {value, changedAt}

function sampleAt(t) {
  // the newest sample at or before t (samples are in time order)
  let best = samples[0];
  for (const s of samples) { if (s.t <= t) best = s; else break; }
  return best;
}

function rate(a, b, key) {
  const dt = b.t - a.t;
  return dt > 0 ? (b[key] - a[key]) / dt : null;
}

function update(st) {
  const now = st.now;
  const tot = st.totals;
  samples.push({ t: now, gen: tot.generation_tokens, drafts: tot.drafts, accepted: tot.accepted_tokens,
                 running: st.running, waiting: st.waiting });
  while (samples.length && samples[0].t < now - HISTORY_S - AL_WINDOW_S) samples.shift();
  for (const r of st.steps) steps.push(r);
  if (st.steps.length) lastStepEnd = st.steps[st.steps.length - 1][0];
  if (steps.length > MAX_STEPS) steps = steps.slice(steps.length - MAX_STEPS);
  const spec = !!st.speculative;
  document.querySelectorAll(".spec-only").forEach(e => { e.hidden = !spec; });

  const last = samples[samples.length - 1];
  const tps = samples.length > 1 ? rate(sampleAt(now - RATE_S), last, "gen") : null;
  document.getElementById("t-tps").textContent = fmt(tps, 1);
  document.getElementById("t-running").textContent = st.running;
  document.getElementById("t-max").textContent = "of " + st.max_num_seqs;
  document.getElementById("t-waiting").textContent = st.waiting;
  document.getElementById("t-mode").textContent = spec
    ? `${st.speculative.method}, ${st.speculative.policy_name}, up to ${st.speculative.num_speculative_tokens} drafts`
    : "plain (no speculation)";
  document.getElementById("t-ece").textContent = fmt(st.calibration.ece, 3);

  // time series: one point per poll, x in seconds before now
  const tpsPts = [], runPts = [], waitPts = [], alPts = [];
  for (let i = 1; i < samples.length; i++) {
    const s = samples[i], x = s.t - now;
    if (x < -HISTORY_S) continue;
    tpsPts.push([x, rate(samples[i - 1], s, "gen")]);
    runPts.push([x, s.running]);
    waitPts.push([x, s.waiting]);
    const p = sampleAt(s.t - AL_WINDOW_S);
    const dd = s.drafts - p.drafts;
    alPts.push([x, dd > 0 ? (s.accepted - p.accepted + dd) / dd : null]);
  }
  const alNow = alPts.length ? alPts[alPts.length - 1][1] : null;
  document.getElementById("t-al").textContent = fmt(alNow, 2);
  const timeAxis = { xLabel: "seconds ago (s)", xMin: -HISTORY_S, xMax: 0 };
  drawChart(document.getElementById("c-tps"), Object.assign({}, timeAxis, {
    yLabel: "tokens/s", series: [{ label: "output", color: COLORS.a, points: tpsPts }], empty: "waiting for data" }));
  drawChart(document.getElementById("c-req"), Object.assign({}, timeAxis, {
    yLabel: "requests", yFloor: 4, series: [{ label: "running", color: COLORS.a, points: runPts },
                                            { label: "waiting", color: COLORS.b, points: waitPts }] }));
  if (spec) {
    drawChart(document.getElementById("c-al"), Object.assign({}, timeAxis, {
      yLabel: "tokens / round", yMin: 1, yFloor: 2,
      series: [{ label: "mean acceptance length", color: COLORS.c, points: alPts }], empty: "no drafts yet" }));
    const pos = st.calibration.positions;
    drawChart(document.getElementById("c-cal"), {
      xLabel: "draft position k", yLabel: "P(accepted | earlier accepted)", xMin: 0.5,
      xMax: Math.max(pos.length, st.speculative.num_speculative_tokens) + 0.5, yMin: 0, yMax: 1,
      series: [{ label: "predicted (confidence head)", color: COLORS.a, marks: true,
                 points: pos.map(p => [p.position + 1, p.predicted]) },
               { label: "observed", color: COLORS.c, marks: true, points: pos.map(p => [p.position + 1, p.observed]) }],
      empty: "no verified drafts yet" });
    drawVerifyLengths(st);
  }
  drawSteps(st);
  drawEvents(st);
  drawFallback(st);
}

function drawVerifyLengths(st) {
  const counts = new Map(), sums = new Map();
  for (const r of steps) {
    const lens = r[5], b = lens.length;
    if (!b) continue;
    for (const L of lens) {
      const k = b + "," + L;
      counts.set(k, (counts.get(k) || 0) + 1);
    }
    const m = sums.get(b) || [0, 0];
    m[0] += lens.reduce((a, c) => a + c, 0); m[1] += b;
    sums.set(b, m);
  }
  const total = Math.max(1, [...counts.values()].reduce((a, c) => a + c, 0));
  const dots = [...counts].map(([k, n]) => {
    const [b, L] = k.split(",").map(Number);
    return [b, L, 2 + 10 * Math.sqrt(n / total)];
  });
  const mean = [...sums].sort((a, b) => a[0] - b[0]).map(([b, m]) => [b, m[0] / m[1]]);
  drawChart(document.getElementById("c-vl"), {
    xLabel: "batch size (requests decoding in the step)", yLabel: "draft tokens verified", xMin: 0,
    xMax: Math.max(4, ...mean.map(p => p[0])) + 1, yMin: 0, yMax: st.speculative.num_speculative_tokens + 0.5,
    series: [{ label: "per request", color: COLORS.d, kind: "dots", points: dots },
             { label: "mean", color: COLORS.b, marks: true, points: mean }], empty: "no steps yet" });
}

function drawSteps(st) {
  const drafted = [], plain = [];
  for (const r of steps) (r[3] > 0 ? drafted : plain).push([r[2], r[1]]);
  const series = [];
  let xMax = Math.max(8, ...steps.map(r => r[2])) * 1.1;
  if (st.table) {
    const t = st.table;
    const cut = t.tokens.findIndex(n => n > xMax * 1.5);
    const upto = cut < 0 ? t.tokens.length : Math.max(2, cut + 1);
    series.push({ label: "table (target forward)", color: COLORS.grey, points: t.tokens.slice(0, upto).map((n, i) => [n, t.ms[i]]) });
  }
  series.push({ label: "plain step", color: COLORS.a, kind: "dots", points: plain });
  if (st.speculative) series.push({ label: "step with drafting", color: COLORS.c, kind: "dots", points: drafted });
  document.getElementById("step-note").textContent = st.table
    ? "wall time of each recent step by tokens in its target forward, over the profiled step-time table"
    : "wall time of each recent step by tokens in its target forward (no step-time table: plain decoding)";
  drawChart(document.getElementById("c-step"), { xLabel: "tokens in the target forward", yLabel: "step time (ms)",
    xMin: 0, xMax: xMax, series: series, empty: "no steps yet" });
}

function drawEvents(st) {
  const e = st.events;
  const rows = [["drafter skipped (async policy: drafting did not pay)", "drafter_skips", !!st.speculative],
                ["requests left out of drafting (verified nothing lately), request-steps", "request_skips", !!st.speculative],
                ["drafter faults survived", "drafter_faults", !!st.speculative],
                ["thread fallbacks (other processes took cores)", "thread_fallbacks", true],
                ["slow windows (steps over 3x their reference)", "slow_windows", true],
                ["step-time table refreshes", "table_refreshes", !!st.table]];
  const now = Date.now();
  const html = [];
  for (const [label, key, shown] of rows) {
    if (!shown) continue;
    const seen = eventSeen[key];
    if (seen && seen.value !== e[key]) seen.changedAt = now;
    eventSeen[key] = { value: e[key], changedAt: seen ? seen.changedAt : 0 };
    const hot = key !== "drafter_skips" && key !== "request_skips" && now - eventSeen[key].changedAt < 60000;
    html.push(`<tr class="${hot ? "hot" : ""}"><td>${label}</td><td class="n">${e[key]}</td></tr>`);
  }
  const reduced = e.threads < e.threads_wanted;
  html.push(`<tr class="${reduced ? "hot" : ""}"><td>torch threads now (of ${e.threads_wanted})</td><td class="n">${e.threads}</td></tr>`);
  document.getElementById("events").innerHTML = html.join("");
}

function drawFallback(st) {
  const f = st.fallback;
  const card = document.getElementById("fallback-card");
  card.hidden = !f || !st.speculative;
  if (card.hidden) return;
  document.getElementById("fallback-note").textContent = f.from_requests === null
    ? "the plain-decoding fallback governs every load level; each starts with speculation. Scores: tokens per second over a plain step's, latest run of each mode"
    : `the plain-decoding fallback decides the load levels in the table: those of ${f.from_requests} running requests and more start with plain decoding, and below them speculation runs unless the table lists the level. Where a step speculates, the drafter is governed the same way against its absence ("(drafter)" rows; off means prompt lookup alone with hybrid drafting, else a plain step; with hybrid drafting every level starts with it off). Scores: tokens per second over a plain step's, latest run of each mode`;
  const score = x => (x === null || x === undefined ? "–" : x.toFixed(3));
  const html = ["<tr><th>requests</th><th>now</th><th>score spec.</th><th>score plain</th><th>steps spec. / plain</th><th>switches</th></tr>"];
  for (const lv of f.levels) {
    html.push(`<tr><td>${lv.requests}</td><td>${lv.mode}</td><td class="n">${score(lv.score.speculative)}</td>` +
              `<td class="n">${score(lv.score.plain)}</td><td class="n">${lv.steps.speculative} / ${lv.steps.plain}</td>` +
              `<td class="n">${lv.switches}</td></tr>`);
  }
  if (!f.levels.length) html.push(`<tr><td colspan="6">no governed load reached yet</td></tr>`);
  // where a step speculates: the drafter on or off, by the same measure
  const [on, off] = f.drafter_modes || ["drafter", "lookup"];
  const mode = m => (m === on ? "drafter on" : `drafter off (${off})`);
  for (const lv of f.drafter_levels || []) {
    html.push(`<tr><td>${lv.requests} (drafter)</td><td>${mode(lv.mode)}</td><td class="n">${score(lv.score[on])}</td>` +
              `<td class="n">${score(lv.score[off])} (off)</td><td class="n">${lv.steps[on]} / ${lv.steps[off]}</td>` +
              `<td class="n">${lv.switches}</td></tr>`);
  }
  document.getElementById("fallback").innerHTML = html.join("");
}

async function poll() {
  const status = document.getElementById("status");
  try {
    const url = "/dashboard/state" + (lastStepEnd !== null ? "?since=" + lastStepEnd : "");
    const r = await Live.fetch(url);
    const st = await r.json();
    if (st.phase !== "ready") {
      status.textContent = "server " + st.phase + "…";
    } else {
      update(st);
      status.textContent = "live · updated " + new Date().toLocaleTimeString();
      status.classList.remove("down");
      document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1);
    }
  } catch (err) {
    status.textContent = "server unreachable; retrying";
    status.classList.add("down");
  }
  setTimeout(poll, 1000);
}

Live.ready().then(poll);
