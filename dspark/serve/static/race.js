// The race: POST /dashboard/race, read its server-sent events from the response body.
"use strict";

const sides = {};

function resetSide(name) {
  sides[name] = { tokens: 0, accepted: 0, started: performance.now(), done: null };
  document.getElementById("out-" + name).textContent = "";
  document.getElementById("stats-" + name).textContent = "";
}

function showProgress(name) {
  const s = sides[name];
  if (s.done) return;
  const secs = (performance.now() - s.started) / 1000;
  document.getElementById("stats-" + name).textContent =
    `${s.tokens} tokens · ${fmt(s.tokens / Math.max(secs, 1e-3), 1)} tok/s so far` +
    (name === "spec" ? ` · ${s.accepted} drafted and accepted` : "");
}

function onEvent(ev) {
  if (ev.type === "start") {
    document.getElementById("spec-tag").textContent = ev.speculative
      ? "drafted tokens verified in the same step"
      : "this server runs without speculation: both sides decode plain";
  } else if (ev.type === "tokens") {
    const out = document.getElementById("out-" + ev.side);
    const s = sides[ev.side];
    const frag = document.createDocumentFragment();
    for (const [text, drafted] of ev.pieces) {
      s.tokens += 1;
      if (drafted) s.accepted += 1;
      if (!text) continue;
      if (drafted) {
        const span = document.createElement("span");
        span.className = "d";
        span.textContent = text;
        frag.appendChild(span);
      } else {
        frag.appendChild(document.createTextNode(text));
      }
    }
    out.appendChild(frag);
    out.scrollTop = out.scrollHeight;
    showProgress(ev.side);
  } else if (ev.type === "done") {
    sides[ev.side].done = ev;
    const extra = ev.side === "spec" ? ` · ${ev.accepted} drafted and accepted` : "";
    document.getElementById("stats-" + ev.side).textContent =
      `${ev.tokens} tokens in ${fmt(ev.seconds, 2)} s · ${fmt(ev.tokens_per_s, 1)} tok/s · ${ev.steps} steps` + extra;
  } else if (ev.type === "verdict") {
    const v = document.getElementById("verdict");
    v.hidden = false;
    v.className = ev.identical ? "same" : "differ";
    v.dataset.identical = String(ev.identical);
    v.textContent = ev.identical
      ? `Identical texts (${ev.spec_tokens} tokens). Speculative decoding finished ${fmt(ev.speedup, 2)}x as fast, ` +
        `in ${sides.spec.done.steps} steps against ${sides.plain.done.steps}.`
      : `The texts DIFFER (${ev.plain_tokens} against ${ev.spec_tokens} tokens): greedy speculative decoding must ` +
        "reproduce plain decoding exactly; this is a bug.";
  } else if (ev.type === "error") {
    document.getElementById("race-status").textContent = "error: " + ev.message;
  }
}

async function race() {
  const button = document.getElementById("go");
  const status = document.getElementById("race-status");
  button.disabled = true;
  status.textContent = "racing…";
  document.getElementById("verdict").hidden = true;
  resetSide("plain");
  resetSide("spec");
  try {
    const body = JSON.stringify({ prompt: document.getElementById("prompt").value,
                                  max_tokens: Number(document.getElementById("max-tokens").value) });
    const r = await Live.fetch("/dashboard/race", { method: "POST", body: body,
                                                    headers: { "Content-Type": "application/json" } });
    if (!r.ok) {
      const err = await r.json().catch(() => ({}));
      status.textContent = "refused: " + ((err.error && err.error.message) || r.status);
      return;
    }
    const reader = r.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const line = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        if (line.startsWith("data: ")) onEvent(JSON.parse(line.slice(6)));
      }
    }
    status.textContent = "";
  } catch (err) {
    status.textContent = "the connection failed: " + err;
  } finally {
    button.disabled = false;
  }
}

document.getElementById("go").addEventListener("click", race);
Live.ready();
