"use strict";
// One batch (/dashboard/batches/{id}): its life as a timeline, progress charts, shards, numbers, notifications
// and the first lines of its result files. Polls while the batch is active, and a little after it ends (Notify).
const PREVIEW_LINES = 10;
const AFTER_END_POLLS = 10;
const drawn = new Map();  // section id -> JSON last drawn: a section is redrawn only when its data changed
let endedPolls = 0;
const previewed = new Set();

function section(id, data, draw) {
  const json = JSON.stringify(data);
  if (drawn.get(id) === json) return;
  drawn.set(id, json);
  $(id).replaceChildren(...[draw()].flat().filter(Boolean));
}

const at = (ts) => h("time", { datetime: new Date(ts * 1000).toISOString(), title: absolute(ts) }, absolute(ts));
const secs = (v) => (typeof v === "number" ? (v < 10 ? v.toFixed(1) + " s" : duration(v)) : "—");

function timeline(b) {
  const end = ENDED_AT[b.status];
  const terminal = end ? [label(b.status), b[end]] : ["done", null];
  const steps = [["created", b.created_at], ["validating", b.created_at], ["in progress", b.in_progress_at]];
  if (b.cancelling_at) steps.push(["cancelling", b.cancelling_at]);
  steps.push(["finalizing", b.finalizing_at], terminal);
  const current = end ? steps.length - 1 : steps.findIndex((s) => s[0] === label(b.status));
  let prev = null;
  return steps.map(([name, ts], i) => {
    const state = i < current || (end && i === current) ? "done" : i === current ? "current" : "todo";
    const skipped = state === "done" && !ts && i > 1;
    const since = ts && prev ? h("span", { class: "muted" }, ` +${duration(ts - prev)}`) : null;
    if (ts) prev = ts;
    return h("li", { class: `step ${skipped ? "skipped" : state}`, "aria-current": i === current ? "step" : null },
      h("span", { class: "step-name" }, name),
      h("span", { class: "small" }, ts ? at(ts) : skipped ? "skipped" : state === "current" ? "now" : "—", since));
  });
}

function stats(b) {
  const c = b.request_counts || { total: 0, completed: 0, failed: 0 };
  const u = liveUsage(b);
  const cost = (b.nightbatch && b.nightbatch.cost) || null;
  const endAt = b.finalizing_at || b[ENDED_AT[b.status]] || Date.now() / 1000;
  const ran = b.in_progress_at ? Math.max(1, endAt - b.in_progress_at) : null;
  const rows = [
    ["Requests", `${num(c.completed)} ok · ${num(c.failed)} failed · ${num(c.total)} total`],
    ["Tokens", u ? `${num(u.total_tokens)} (in ${num(u.input_tokens)} · out ${num(u.output_tokens)})` : "—"],
    ["Output tokens/s", u && ran ? (u.output_tokens / ran).toFixed(1) + " average" : "—"],
    ["Cost", cost && money(cost.estimated_cost_usd) ? `${money(cost.estimated_cost_usd)}${cost.estimate ? " (estimate)" : ""}` : "—"],
    ["GPU-seconds", cost && typeof cost.gpu_seconds === "number"
      ? `${cost.gpu_seconds.toFixed(1)} s` + (typeof cost.load_share === "number"
        ? ` · ${Math.round(100 * cost.load_share)}% loading the model` : "") : "—"],
    ["Instance", cost && cost.instance_type ? `${cost.instance_type} · ${cost.capacity || ""}` : "—"],
    ["Window", `${b.completion_window}` + (b.expires_at ? ` · expires ${absolute(b.expires_at)}` : "")],
  ];
  return h("dl", { class: "stats" }, rows.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
}

const timingName = (k) => k.replace(/_seconds$/, "").replace(/_/g, " ");

function shardsTable(b, d) {
  if (!d || !d.shards.length) {
    return h("p", { class: "muted" }, b.status === "validating" ? "Shards are planned once the input is valid."
      : "No shards were planned.");
  }
  const keys = [];
  for (const s of d.shards) for (const a of s.attempts) for (const k of Object.keys(a)) {
    if (k.endsWith("_seconds") && !keys.includes(k)) keys.push(k);
  }
  // Phases of the latest attempt that reported them: seconds from its container start (nightbatch.phases).
  const phaseKeys = [];
  for (const s of d.shards) for (const a of s.attempts) for (const k of Object.keys(a.phases || {})) {
    if (k.endsWith("_s") && !phaseKeys.includes(k)) phaseKeys.push(k);
  }
  const head = ["Shard", "State", "Lines", "Attempts", ...keys.map(timingName),
    ...phaseKeys.map((k) => k.replace(/_s$/, "").replace(/_/g, " ") + " at"), "First result", "Checkpoints"];
  const rows = d.shards.map((s) => {
    const sum = (k) => s.attempts.reduce((acc, a) => acc + (typeof a[k] === "number" ? a[k] : 0), 0);
    const first = s.attempts.map((a) => a.first_result_at).filter(Boolean).sort()[0];
    return h("tr", { "data-shard": s.shard_id },
      h("td", { class: "mono" }, s.shard_id),
      h("td", {}, h("span", { class: "status sh-" + s.state }, label(s.state))),
      h("td", { class: "num" }, s.lines === null || s.lines === undefined ? "—" : num(s.lines)),
      h("td", { class: "num" }, String(s.attempts.length || (s.done && s.done.attempts) || 0)),
      keys.map((k) => h("td", { class: "num" }, s.attempts.some((a) => k in a) ? secs(sum(k)) : "—")),
      phaseKeys.map((k) => {
        const a = s.attempts.filter((x) => x.phases && typeof x.phases[k] === "number").pop();
        return h("td", { class: "num", title: a && a.phases.weights_source ? "weights from " + a.phases.weights_source : null },
          a ? secs(a.phases[k]) : "—");
      }),
      h("td", { class: "num" }, first && b.in_progress_at ? "+" + duration(first - b.in_progress_at) : "—"),
      h("td", { class: "num" }, num(s.checkpoints)));
  });
  return [
    h("div", { class: "scroll", tabindex: "0", role: "region", "aria-label": "Shards" }, h("table", { class: "plain" },
      h("thead", {}, h("tr", {}, head.map((t, i) => h("th", { scope: "col", class: i > 1 ? "num" : null }, t)))),
      h("tbody", {}, rows))),
    d.shards_truncated ? h("p", { class: "small muted" }, `Showing ${d.shards.length} of ${d.shard_count} shards.`) : null,
  ];
}

function errorList(b) {
  const errors = (b.errors && b.errors.data) || [];
  $("b-errors-card").hidden = !errors.length;
  return h("ul", { class: "line-errors" }, errors.map((e) => h("li", {},
    h("span", { class: "line" }, e.line ? "line " + e.line : ""), h("code", {}, e.code), e.message)));
}

function metadata(b) {
  const meta = Object.entries(b.metadata || {});
  if (!meta.length) return h("p", { class: "muted" }, "No metadata.");
  return h("dl", { class: "stats" }, meta.map(([k, v]) => [h("dt", { class: "mono" }, k), h("dd", {}, v)]));
}

function notifications(b, d) {
  const n = d && d.notifications;
  if (!n || !n.event) {
    return h("p", { class: "muted" }, ACTIVE.has(b.status) || b.status === "validating"
      ? "Webhooks and e-mails go out when the batch ends." : "Nothing sent yet.");
  }
  const out = [h("p", {}, h("code", {}, n.event.type), " ", n.event.created_at ? at(n.event.created_at) : "")];
  if (n.webhooks.length) {
    out.push(h("div", { class: "scroll", tabindex: "0", role: "region", "aria-label": "Webhook deliveries" }, h("table", { class: "plain" },
      h("thead", {}, h("tr", {}, ["Webhook", "Status", "Attempts"].map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, n.webhooks.map((w) => h("tr", {},
        h("td", { class: "mono" }, w.url || w.webhook_endpoint_id),
        h("td", {}, h("span", { class: "status wh-" + w.status }, w.status)),
        h("td", { class: "small" }, w.attempts.map((a) => h("div", {},
          `#${a.attempt} `, a.status_code ? `HTTP ${a.status_code}` : (a.error || "no answer"),
          ` · ${a.duration_ms} ms · `, at(a.attempted_at))))))))));
  } else {
    out.push(h("p", { class: "muted small" }, "No webhook endpoints subscribed to this event."));
  }
  out.push(n.emails.length
    ? h("ul", { class: "plain-list" }, n.emails.map((e) => h("li", {}, `E-mail to ${e.to}: ${e.status}`)))
    : h("p", { class: "muted small" }, "No e-mails."));
  if (n.sns_message_id) out.push(h("p", { class: "small muted" }, `SNS message ${n.sns_message_id}`));
  return out;
}

// ---- results preview -------------------------------------------------------------------------------------

// What a person wants to read of one result line: the model's words (and tool calls), or the error.
function readable(row) {
  const r = row.response || {};
  const body = r.body || {};
  if (row.error) return [["error", row.error.message || JSON.stringify(row.error)]];
  if (body.error) return [["error", body.error.message || JSON.stringify(body.error)]];
  const parts = [];
  for (const c of body.choices || []) {
    const m = c.message || {};
    if (m.reasoning_content || m.reasoning) parts.push(["reasoning", m.reasoning_content || m.reasoning]);
    if (typeof m.content === "string" && m.content) parts.push(["text", m.content]);
    for (const t of m.tool_calls || []) {
      if (t.function) parts.push(["tool", `${t.function.name}(${t.function.arguments})`]);
    }
    if (typeof c.text === "string") parts.push(["text", c.text]);
  }
  for (const o of body.output || []) {
    if (o.type === "message") for (const c of o.content || []) if (c.text) parts.push(["text", c.text]);
    if (o.type === "reasoning") for (const c of o.summary || []) if (c.text) parts.push(["reasoning", c.text]);
    if (o.type === "function_call") parts.push(["tool", `${o.name}(${o.arguments})`]);
  }
  const data = body.data || [];
  if (data.length && data[0].embedding) parts.push(["note", `${data.length} embedding(s) · ${data[0].embedding.length} dimensions`]);
  return parts;
}

function previewLine(entry) {
  if (!entry.json) {
    return h("li", { class: "pline" }, h("div", { class: "phead" }, h("span", { class: "muted" }, `line ${entry.line}`),
      entry.truncated ? h("span", { class: "chip" }, "cut: longer than the preview reads") : null),
    h("pre", { class: "raw" }, entry.text));
  }
  const row = entry.json;
  const code = row.response && row.response.status_code;
  const parts = readable(row);
  return h("li", { class: "pline" },
    h("div", { class: "phead" }, h("span", { class: "muted" }, `line ${entry.line}`),
      h("span", { class: "mono" }, row.custom_id || ""),
      code ? h("span", { class: "status " + (code < 400 ? "s-completed" : "s-failed") }, String(code)) : null),
    parts.map(([kind, text]) => h("div", { class: "ptext " + kind },
      kind === "text" ? null : h("span", { class: "kind" }, kind), text)),
    h("details", {}, h("summary", {}, "JSON"), h("pre", { class: "raw" }, JSON.stringify(row, null, 2))));
}

async function loadPreview(fileId, title) {
  const box = h("div", { class: "preview", "data-file": fileId },
    h("h3", {}, title, " ", h("span", { class: "small muted mono" }, fileId)), h("p", { class: "muted" }, "Loading…"));
  $("b-preview").append(box);
  try {
    const p = await api("GET", `/nightbatch/files/${encodeURIComponent(fileId)}/preview?lines=${PREVIEW_LINES}`);
    const dl = h("button", { type: "button", onclick: (e) => download(fileId, e.currentTarget) },
      `Download all (${num(p.bytes)} bytes)`);
    box.replaceChildren(box.firstChild, h("ol", { class: "plines" }, p.lines.map(previewLine)),
      h("p", { class: "small muted" }, p.has_more ? `First ${p.lines.length} lines. ` : "The whole file. "), dl);
  } catch (e) {
    box.replaceChildren(box.firstChild, h("p", { class: "error" }, "Could not load the preview: " + e.message));
  }
}

// The lines finished so far of a running batch (GET /v1/nightbatch/batches/{id}/preview), fetched again
// only when its counts moved.
async function partialPreview(b) {
  const boxes = [];
  for (const [kind, title] of [["output", "Output so far"], ["error", "Errors so far"]]) {
    const p = await api("GET",
      `/nightbatch/batches/${encodeURIComponent(b.id)}/preview?kind=${kind}&lines=${PREVIEW_LINES}`);
    if (!p.lines.length) continue;
    boxes.push(h("div", { class: "preview partial", "data-kind": kind }, h("h3", {}, title),
      h("ol", { class: "plines" }, p.lines.map(previewLine)),
      h("p", { class: "small muted" }, `The first ${p.lines.length} of the lines finished so far (about ` +
        `${num(p.count)}); the file appears when the batch ends. All of them: nightbatch results ${b.id} --partial` +
        (kind === "error" ? " --errors" : ""))));
  }
  return boxes.length ? boxes
    : [h("p", { class: "muted" }, "No results yet. The output and error files appear when the batch ends.")];
}

// ---- the view --------------------------------------------------------------------------------------------

function header(b) {
  const actions = [];
  if (CANCELLABLE.has(b.status)) {
    actions.push(h("button", { class: "danger", type: "button", onclick: (e) => cancel(b.id, e.currentTarget) },
      "Cancel"));
  }
  return [
    h("h1", { id: "b-title", class: "mono" }, b.id),
    h("span", { class: "status s-" + b.status, id: "b-status" }, label(b.status)),
    h("span", { class: "muted" }, b.endpoint.replace(/^\/v1\//, "") + (b.model ? " · " + b.model : "")),
    h("span", { class: "spacer" }), actions,
  ];
}

const batchView = {
  section: "batch-view",
  async load() {
    const id = encodeURIComponent(BATCH_ID);
    const b = await api("GET", `/batches/${id}`);
    const d = await api("GET", `/nightbatch/batches/${id}/detail`);
    document.title = `nightbatch · ${b.id}`;
    section("b-head", [b.id, b.status, b.endpoint, b.model], () => header(b));
    section("b-timeline", [b.status, b.created_at, b.in_progress_at, b.finalizing_at, b.cancelling_at,
      b[ENDED_AT[b.status]]], () => timeline(b));
    section("b-stats", [b.request_counts, liveUsage(b), b.nightbatch && b.nightbatch.cost, b.status], () => stats(b));
    section("b-charts", [d.progress.points, b.in_progress_at],
      () => progressCharts(d.progress.points, b.in_progress_at));
    section("b-shards", d.shards, () => shardsTable(b, d));
    section("b-errors", b.errors, () => errorList(b));
    section("b-meta", b.metadata, () => metadata(b));
    section("b-notify", [d.notifications, b.status], () => notifications(b, d));
    for (const [fid, title] of [[b.output_file_id, "Output"], [b.error_file_id, "Errors"]]) {
      if (fid && !previewed.has(fid)) {
        if (!previewed.size) $("b-preview").replaceChildren();  // the results so far give way to the files
        previewed.add(fid);
        loadPreview(fid, title);
      }
    }
    if (!previewed.size && ACTIVE.has(b.status) && b.status !== "validating") {
      const key = JSON.stringify(["partial", b.status, b.request_counts]);
      if (drawn.get("b-preview") !== key) {
        const boxes = await partialPreview(b);
        drawn.set("b-preview", key);
        if (!previewed.size) $("b-preview").replaceChildren(...boxes);
      }
    } else if (!previewed.size) {
      section("b-preview", b.status, () => h("p", { class: "muted" }, "The output and error files appear when the batch ends."));
    } else if ($("b-preview").firstChild && $("b-preview").firstChild.tagName === "P") {
      $("b-preview").firstChild.remove();
    }
    if (ACTIVE.has(b.status)) { endedPolls = 0; return true; }
    return ++endedPolls <= AFTER_END_POLLS;  // Notify runs just after the end: show its deliveries
  },
  clear() {
    drawn.clear();
    previewed.clear();
    for (const id of ["b-head", "b-timeline", "b-stats", "b-charts", "b-shards", "b-errors", "b-meta", "b-notify",
      "b-preview"]) $(id).replaceChildren();
  },
};
