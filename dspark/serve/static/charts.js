// A small canvas chart: axes with units, nice ticks, lines, dots and a legend.
// Enough for the live view; no library, nothing fetched.
"use strict";

function niceTicks(lo, hi, count) {
  if (!(hi > lo)) hi = lo + 1;
  const raw = (hi - lo) / Math.max(1, count);
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 2.5, 5, 10].map(m => m * mag).find(s => s >= raw) || raw;
  const ticks = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) ticks.push(+v.toPrecision(12));
  return ticks;
}

function tickLabel(v) {
  const a = Math.abs(v);
  if (a >= 1e4) return (v / 1e3).toFixed(0) + "k";
  if (a >= 100 || Number.isInteger(v)) return v.toFixed(0);
  if (a >= 1) return v.toFixed(1);
  return v.toFixed(2);
}

// spec: {xLabel, yLabel, xMin, xMax, yMin, yMax, series: [{label, color, kind: "line" | "dots" | "step",
//        points: [[x, y], ...], radius, dash}], empty: "text shown without data"}
function drawChart(canvas, spec) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
    canvas.width = Math.round(w * dpr);
    canvas.height = Math.round(h * dpr);
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  const css = getComputedStyle(document.documentElement);
  const fg = css.getPropertyValue("--fg").trim() || "#222";
  const grid = css.getPropertyValue("--grid").trim() || "#ddd";
  ctx.font = "11px system-ui, sans-serif";

  const pts = spec.series.flatMap(s => s.points.filter(p => p[1] !== null && isFinite(p[1])));
  const xs = pts.map(p => p[0]), ys = pts.map(p => p[1]);
  let xMin = spec.xMin !== undefined ? spec.xMin : Math.min(...xs, 0);
  let xMax = spec.xMax !== undefined ? spec.xMax : Math.max(...xs, 1);
  let yMin = spec.yMin !== undefined ? spec.yMin : Math.min(0, ...ys);
  let yMax = spec.yMax !== undefined ? spec.yMax : Math.max(...ys, spec.yFloor || 1) * 1.1;
  if (xMax <= xMin) xMax = xMin + 1;
  if (yMax <= yMin) yMax = yMin + 1;

  const left = 48, right = 10, top = 22, bottom = 34;
  const pw = w - left - right, ph = h - top - bottom;
  const X = x => left + (x - xMin) / (xMax - xMin) * pw;
  const Y = y => top + ph - (y - yMin) / (yMax - yMin) * ph;

  ctx.strokeStyle = grid;
  ctx.fillStyle = fg;
  ctx.lineWidth = 1;
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  for (const t of niceTicks(yMin, yMax, 4)) {
    ctx.beginPath(); ctx.moveTo(left, Y(t)); ctx.lineTo(left + pw, Y(t)); ctx.stroke();
    ctx.fillText(tickLabel(t), left - 4, Y(t));
  }
  ctx.textAlign = "center";
  ctx.textBaseline = "top";
  for (const t of niceTicks(xMin, xMax, Math.max(2, Math.floor(pw / 70)))) {
    ctx.beginPath(); ctx.moveTo(X(t), top + ph); ctx.lineTo(X(t), top + ph + 4); ctx.stroke();
    ctx.fillText(tickLabel(t), X(t), top + ph + 6);
  }
  ctx.strokeStyle = fg;
  ctx.strokeRect(left, top, pw, ph);
  ctx.fillText(spec.xLabel, left + pw / 2, top + ph + 20);
  ctx.save();
  ctx.translate(11, top + ph / 2);
  ctx.rotate(-Math.PI / 2);
  ctx.textBaseline = "middle";
  ctx.fillText(spec.yLabel, 0, 0);
  ctx.restore();

  ctx.save();
  ctx.beginPath(); ctx.rect(left, top, pw, ph); ctx.clip();
  for (const s of spec.series) {
    ctx.strokeStyle = ctx.fillStyle = s.color;
    ctx.lineWidth = 2;
    ctx.setLineDash(s.dash || []);
    if (s.kind === "dots") {
      for (const [x, y, r] of s.points) {
        if (y === null || !isFinite(y)) continue;
        ctx.globalAlpha = s.alpha || 0.6;
        ctx.beginPath(); ctx.arc(X(x), Y(y), r || s.radius || 2.5, 0, 2 * Math.PI); ctx.fill();
      }
      ctx.globalAlpha = 1;
    } else {
      ctx.beginPath();
      let pen = false;
      for (const [x, y] of s.points) {
        if (y === null || !isFinite(y)) { pen = false; continue; }
        if (pen) ctx.lineTo(X(x), Y(y)); else ctx.moveTo(X(x), Y(y));
        pen = true;
      }
      ctx.stroke();
      if (s.marks) for (const [x, y] of s.points) {
        if (y === null || !isFinite(y)) continue;
        ctx.beginPath(); ctx.arc(X(x), Y(y), 3, 0, 2 * Math.PI); ctx.fill();
      }
    }
  }
  ctx.restore();
  ctx.setLineDash([]);

  // legend, top left, one row
  ctx.textAlign = "left";
  ctx.textBaseline = "middle";
  let lx = left;
  for (const s of spec.series) {
    if (!s.label) continue;
    ctx.fillStyle = s.color;
    ctx.fillRect(lx, 6, 10, 10);
    ctx.fillStyle = fg;
    ctx.fillText(s.label, lx + 14, 11);
    lx += 22 + ctx.measureText(s.label).width;
  }
  if (!pts.length && spec.empty) {
    ctx.fillStyle = fg;
    ctx.textAlign = "center";
    ctx.fillText(spec.empty, left + pw / 2, top + ph / 2);
  }
}
