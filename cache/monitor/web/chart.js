// A small line chart on a canvas: enough for a live view of a few series,
// with no library and nothing fetched from the network.
//
// drawChart(canvas, series) draws series = [{name, color, points: [[t, v], ...]}]
// (t in milliseconds) over their common time range, from 0 to the largest
// value. It records what it drew on the canvas's dataset: points (the most
// points of one series) and peak (the largest value), for a reader or a test.
"use strict";

function niceCeil(v) {
  if (!(v > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) {
    if (m * p >= v) return m * p;
  }
  return 10 * p;
}

function drawChart(canvas, series, fmt) {
  fmt = fmt || (v => String(Math.round(v)));
  const ratio = window.devicePixelRatio || 1;
  const cssW = canvas.clientWidth || canvas.width, cssH = canvas.clientHeight || canvas.height;
  if (canvas.width !== Math.round(cssW * ratio)) {
    canvas.width = Math.round(cssW * ratio);
    canvas.height = Math.round(cssH * ratio);
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, cssW, cssH);
  const left = 64, right = 12, top = 22, bottom = 22;
  const w = cssW - left - right, h = cssH - top - bottom;

  let t0 = Infinity, t1 = -Infinity, peak = 0, most = 0;
  for (const s of series) {
    most = Math.max(most, s.points.length);
    for (const [t, v] of s.points) {
      t0 = Math.min(t0, t); t1 = Math.max(t1, t);
      peak = Math.max(peak, v);
    }
  }
  const ymax = niceCeil(peak);
  if (!(t1 > t0)) { t0 = (isFinite(t0) ? t0 : 0) - 1000; t1 = t0 + 1000; }
  const x = t => left + (t - t0) / (t1 - t0) * w;
  const y = v => top + h - v / ymax * h;

  // Grid and labels: four lines up the value axis.
  ctx.font = "11px system-ui, sans-serif";
  ctx.textBaseline = "middle";
  ctx.lineWidth = 1;
  for (let i = 0; i <= 4; i++) {
    const v = ymax * i / 4, yy = Math.round(y(v)) + 0.5;
    ctx.strokeStyle = i === 0 ? "#999" : "#e5e5e5";
    ctx.beginPath(); ctx.moveTo(left, yy); ctx.lineTo(left + w, yy); ctx.stroke();
    ctx.fillStyle = "#666"; ctx.textAlign = "right";
    ctx.fillText(fmt(v), left - 6, yy);
  }
  ctx.textAlign = "left"; ctx.fillStyle = "#666";
  ctx.fillText(Math.round((t1 - t0) / 1000) + " s", left, cssH - 8);

  // Series, and a legend along the top.
  let lx = left;
  for (const s of series) {
    ctx.strokeStyle = s.color; ctx.lineWidth = 2; ctx.lineJoin = "round";
    ctx.beginPath();
    s.points.forEach(([t, v], i) => (i ? ctx.lineTo(x(t), y(v)) : ctx.moveTo(x(t), y(v))));
    ctx.stroke();
    if (s.points.length === 1) {
      const [t, v] = s.points[0];
      ctx.fillStyle = s.color; ctx.fillRect(x(t) - 2, y(v) - 2, 4, 4);
    }
    ctx.fillStyle = s.color; ctx.fillRect(lx, 6, 10, 10);
    ctx.fillStyle = "#333"; ctx.textAlign = "left";
    ctx.fillText(s.name, lx + 14, 11);
    lx += 24 + ctx.measureText(s.name).width;
  }
  canvas.dataset.points = String(most);
  canvas.dataset.peak = String(peak);
}
