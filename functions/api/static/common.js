"use strict";
// Shared by every view of the page: the API, the key, formatting, small DOM helpers.
// The /v1 API sits next to this page, also behind an API Gateway stage prefix such as /prod.
const BASE = location.pathname.replace(/\/(dashboard(\/.*)?)?$/, "");
const API = BASE + "/v1";
const KEY_SLOT = "nightbatch.apiKey";
const POLL_MS = 3000;
const CANCELLABLE = new Set(["validating", "in_progress"]);
const ACTIVE = new Set(["validating", "in_progress", "finalizing", "cancelling"]);
const ENDED_AT = { completed: "completed_at", failed: "failed_at", expired: "expired_at", cancelled: "cancelled_at" };

const $ = (id) => document.getElementById(id);
const batchUrl = (id) => BASE + "/dashboard/batches/" + encodeURIComponent(id);

function h(tag, props, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : String(c));  // text nodes: nothing from the API is parsed as HTML
  }
  return el;
}


class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function api(method, path, body) {
  let res;
  const headers = { "Authorization": "Bearer " + sessionStorage.getItem(KEY_SLOT) };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  try {
    res = await fetch(API + path, {
      method, cache: "no-store", headers, body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (e) {
    throw new ApiError(0, "Cannot reach the server.");
  }
  const data = await res.json().catch(() => null);
  if (!res.ok) throw new ApiError(res.status, (data && data.error && data.error.message) || "HTTP " + res.status);
  return data;
}

// ---- formatting -------------------------------------------------------------------------------------------

const num = (n) => Number(n || 0).toLocaleString("en-US");
const label = (status) => status.replace("_", " ");

function duration(seconds) {
  seconds = Math.max(0, Math.round(seconds));
  const d = Math.floor(seconds / 86400), hr = Math.floor(seconds % 86400 / 3600);
  const m = Math.floor(seconds % 3600 / 60), s = seconds % 60;
  if (d) return `${d}d ${hr}h`;
  if (hr) return `${hr}h ${m}m`;
  if (m) return `${m}m ${String(s).padStart(2, "0")}s`;
  return `${s}s`;
}

function relative(ts) {
  const delta = ts - Date.now() / 1000;
  if (Math.abs(delta) < 5) return "just now";
  return delta < 0 ? duration(-delta) + " ago" : "in " + duration(delta);
}

const absolute = (ts) => new Date(ts * 1000).toLocaleString();

// A time that keeps itself current: refreshed on every poll without redrawing its row.
function when(prefix, ts) {
  return h("div", { title: absolute(ts) }, prefix + " ", h("span", { "data-ts": String(ts) }, relative(ts)));
}

function money(value) {
  if (typeof value !== "number") return null;
  return "$" + (value >= 1 || value === 0 ? value.toFixed(2) : value.toPrecision(2));
}

// batch.nightbatch.cost: an estimate from the GPU-seconds the shards recorded and the instance price.
function costCell(b) {
  const cost = b.nightbatch && b.nightbatch.cost;
  const amount = cost && money(cost.estimated_cost_usd);
  if (!amount) return h("td", { class: "num muted" }, "—");
  const detail = [];
  if (typeof cost.gpu_seconds === "number") detail.push(`${cost.gpu_seconds.toFixed(1)} GPU-s`);
  if (cost.estimate) detail.push("estimate");
  return h("td", { class: "num" }, amount, detail.length ? h("div", { class: "small muted" }, detail.join(" · ")) : null);
}

// Final usage once finalized; during a run, the workers' live token counters.
function liveUsage(b) {
  return b.usage || (b.nightbatch && b.nightbatch.live_usage) || null;
}

function tickTimes() {
  for (const el of document.querySelectorAll("[data-ts]")) el.textContent = relative(Number(el.dataset.ts));
  for (const el of document.querySelectorAll("[data-since]")) {
    el.textContent = duration(Date.now() / 1000 - Number(el.dataset.since));
  }
}

function notice(message, bad) {
  const el = $("notice");
  el.textContent = message || "";
  el.className = "notice" + (bad ? " bad" : "");
  el.hidden = !message;
}


async function download(fileId, button) {
  button.disabled = true;
  try {
    // A link cannot carry the Bearer key: ask for a short-lived signed URL and follow it.
    const link = await api("POST", `/nightbatch/files/${encodeURIComponent(fileId)}/link`);
    const a = h("a", { href: link.url, download: fileId + ".jsonl", hidden: true });
    document.body.append(a);
    a.click();
    a.remove();
  } catch (e) {
    notice(`Could not download ${fileId}: ${e.message}`, true);
    $("notice").dataset.kind = "action";
  } finally {
    button.disabled = false;
  }
}
