"use strict";
// Line charts as plain SVG (no library): a series of [x, y] points, time on x. Every point is a <circle
// class="pt"> with a <title>, and the chart carries a text summary for screen readers.
const SVG_NS = "http://www.w3.org/2000/svg";
const CHART = { w: 640, h: 220, left: 56, right: 16, top: 14, bottom: 30 };

function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  for (const c of children) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}

// 1, 2 or 5 times a power of ten: about `count` steps from 0 to max.
function niceTicks(max, count) {
  if (!(max > 0)) return [0, 1];
  const raw = max / count;
  const p = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map((m) => m * p).find((v) => v >= raw);
  const ticks = [];
  for (let v = 0; v < max + step / 2; v += step) ticks.push(v);
  if (ticks[ticks.length - 1] < max) ticks.push(ticks[ticks.length - 1] + step);
  return ticks;
}

const shortNum = (v) => v >= 1e6 ? (v / 1e6).toFixed(1) + "M" : v >= 1e4 ? Math.round(v / 1e3) + "k"
  : v >= 1000 ? (v / 1e3).toFixed(1) + "k" : String(Math.round(v * 10) / 10);
const clock = (t) => new Date(t * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });

// `points`: [[unix seconds, value], ...] in time order. Returns an <svg>.
function lineChart(points, { title, unit, color, id }) {
  const { w, h, left, right, top, bottom } = CHART;
  const svg = s("svg", { viewBox: `0 0 ${w} ${h}`, role: "img", class: "chart", "aria-labelledby": `${id}-t ${id}-d`,
    "data-points": points.length });
  const last = points[points.length - 1];
  const peak = Math.max(0, ...points.map((p) => p[1]));
  svg.append(s("title", { id: `${id}-t` }, title),
    s("desc", { id: `${id}-d` }, points.length
      ? `${points.length} points from ${clock(points[0][0])} to ${clock(last[0])}; latest ${shortNum(last[1])} ${unit}, peak ${shortNum(peak)} ${unit}.`
      : "No data yet."));
  const ticks = niceTicks(peak, 4);
  const ymax = ticks[ticks.length - 1] || 1;
  const t0 = points.length ? points[0][0] : 0;
  const t1 = points.length > 1 ? last[0] : t0 + 1;
  const x = (t) => left + (w - left - right) * (t - t0) / (t1 - t0 || 1);
  const y = (v) => top + (h - top - bottom) * (1 - v / ymax);
  for (const v of ticks) {
    svg.append(s("line", { x1: left, x2: w - right, y1: y(v), y2: y(v), class: "grid" }),
      s("text", { x: left - 6, y: y(v) + 4, "text-anchor": "end", class: "tick" }, shortNum(v)));
  }
  if (!points.length) {
    svg.append(s("text", { x: w / 2, y: h / 2, "text-anchor": "middle", class: "tick" }, "no data yet"));
    return svg;
  }
  for (const t of [t0, (t0 + t1) / 2, t1]) {
    svg.append(s("text", { x: x(t), y: h - 8, "text-anchor": t === t0 ? "start" : t === t1 ? "end" : "middle",
      class: "tick" }, clock(t)));
  }
  const d = points.map((p, i) => `${i ? "L" : "M"}${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" ");
  svg.append(s("path", { d, fill: "none", stroke: color, "stroke-width": 2, class: "line" }));
  // Dots for every point while few, else every n-th (the line carries the rest).
  const every = Math.max(1, Math.ceil(points.length / 60));
  points.forEach((p, i) => {
    if (i % every && i !== points.length - 1) return;
    svg.append(s("circle", { cx: x(p[0]).toFixed(1), cy: y(p[1]).toFixed(1), r: 3, fill: color, class: "pt" },
      s("title", {}, `${clock(p[0])}: ${shortNum(p[1])} ${unit}`)));
  });
  return svg;
}

// From cumulative [t, completed, failed, output tokens] samples: requests done over time, output tokens/s.
function progressCharts(points, startedAt) {
  const pts = points.slice();
  if (startedAt && pts.length && startedAt < pts[0][0]) pts.unshift([startedAt, 0, 0, 0]);
  const done = pts.map((p) => [p[0], p[1] + p[2]]);
  const rate = [];
  for (let i = 1; i < pts.length; i++) {
    const dt = pts[i][0] - pts[i - 1][0];
    if (dt > 0) rate.push([pts[i][0], (pts[i][3] - pts[i - 1][3]) / dt]);
  }
  const figure = (caption, svg) => h("figure", { class: "chart-fig" }, h("figcaption", {}, caption), svg);
  return [
    figure("Requests done", lineChart(done, { title: "Requests done", unit: "requests", color: "#4338ca",
      id: "chart-done" })),
    figure("Output tokens per second", lineChart(rate, { title: "Output tokens per second", unit: "tokens/s",
      color: "#0f766e", id: "chart-rate" })),
  ];
}
