"use strict";
// The list of batches (/dashboard): newest first, live, only changed rows redrawn.
const PAGE = 20;
const shown = new Map();  // batch id -> {json, el}: only batches that changed are redrawn
let wanted = PAGE;

async function loadBatches() {
  const batches = [];
  let after = null;
  let more = false;
  do {
    const q = new URLSearchParams({ limit: String(Math.min(100, wanted - batches.length)) });
    if (after) q.set("after", after);
    const page = await api("GET", "/batches?" + q);
    batches.push(...page.data);
    more = page.has_more;
    after = page.last_id;
  } while (more && batches.length < wanted);
  return { batches, more };
}


// ---- rendering --------------------------------------------------------------------------------------------

function progressCell(b) {
  const c = b.request_counts || { total: 0, completed: 0, failed: 0 };
  const done = c.completed + c.failed;
  const bar = h("div", { class: "bar" + (ACTIVE.has(b.status) ? " active" : "") },
    h("span", { class: "ok" }), h("span", { class: "bad" }));
  bar.children[0].style.width = (c.total ? 100 * c.completed / c.total : 0) + "%";
  bar.children[1].style.width = (c.total ? 100 * c.failed / c.total : 0) + "%";
  let text;
  if (!c.total) text = { validating: "validating input…", failed: "input rejected" }[b.status] || "no requests";
  else text = `${num(done)} / ${num(c.total)} done (${Math.floor(100 * done / c.total)}%)`;
  const detail = c.total ? `${num(c.completed)} ok · ${num(c.failed)} failed` : null;
  return h("td", { class: "progress" }, bar, h("div", { class: "small progress-text" }, text),
    detail && h("div", { class: "small muted" }, detail));
}

function tokensCell(b) {
  const u = liveUsage(b);
  if (!u) return h("td", { class: "num muted" }, "—");
  return h("td", { class: "num" }, num(u.total_tokens),
    h("div", { class: "small muted" }, `in ${num(u.input_tokens)} · out ${num(u.output_tokens)}`));
}

function timingCell(b) {
  const lines = [when("created", b.created_at)];
  const endKey = ENDED_AT[b.status];
  const start = b.in_progress_at || b.created_at;
  if (endKey && b[endKey]) lines.push(h("div", {}, `took ${duration(b[endKey] - b.created_at)}`));
  else if (b.in_progress_at) lines.push(h("div", {}, "running ", h("span", { "data-since": String(start) },
    duration(Date.now() / 1000 - start))));
  if (ACTIVE.has(b.status) && b.expires_at) lines.push(when("expires", b.expires_at));
  return h("td", { class: "timing small muted" }, lines);
}

function actionsCell(b) {
  const buttons = [];
  if (CANCELLABLE.has(b.status)) {
    buttons.push(h("button", { class: "danger", type: "button", onclick: (e) => cancel(b.id, e.currentTarget) },
      "Cancel"));
  }
  if (b.output_file_id) buttons.push(h("button", { type: "button", title: "Download the output file (JSONL)",
    onclick: (e) => download(b.output_file_id, e.currentTarget) }, "Output"));
  if (b.error_file_id) buttons.push(h("button", { type: "button", title: "Download the error file (JSONL)",
    onclick: (e) => download(b.error_file_id, e.currentTarget) }, "Errors"));
  return h("td", { class: "actions" }, buttons);
}

function batchRows(b) {
  const meta = Object.entries(b.metadata || {});
  const row = h("tr", { class: "batch", "data-id": b.id, "data-status": b.status },
    h("td", { class: "id" }, h("a", { class: "mono batch-link", href: batchUrl(b.id) }, b.id),
      h("div", { class: "small muted what" }, b.endpoint.replace(/^\/v1\//, "") + (b.model ? " · " + b.model : "")),
      meta.length ? h("div", { class: "meta" }, meta.map(([k, v]) => h("span", {}, `${k}=${v}`))) : null),
    h("td", {}, h("span", { class: "status s-" + b.status }, label(b.status))),
    progressCell(b), tokensCell(b),
    costCell(b),
    timingCell(b), actionsCell(b));
  const body = h("tbody", { "data-id": b.id }, row);
  const errors = (b.errors && b.errors.data) || [];
  if (errors.length) {
    const items = errors.slice(0, 20).map((e) => h("li", {},
      h("span", { class: "line" }, e.line ? "line " + e.line : ""), h("code", {}, e.code), e.message));
    if (errors.length > 20) items.push(h("li", { class: "muted" }, `… and ${errors.length - 20} more`));
    body.append(h("tr", { class: "errors" }, h("td", { colspan: "7" }, h("ul", {}, items))));
  }
  return body;
}


function render(batches, more) {
  const table = $("table");
  const seen = new Set();
  batches.forEach((b, i) => {
    seen.add(b.id);
    const json = JSON.stringify(b);
    let entry = shown.get(b.id);
    if (!entry || entry.json !== json) {
      const el = batchRows(b);
      if (entry) entry.el.replaceWith(el);
      entry = { json, el };
      shown.set(b.id, entry);
    }
    if (table.tBodies[i] !== entry.el) table.insertBefore(entry.el, table.tBodies[i] || null);
  });
  for (const [id, entry] of shown) {
    if (!seen.has(id)) { entry.el.remove(); shown.delete(id); }
  }
  $("empty").hidden = batches.length > 0;
  $("table").hidden = batches.length === 0;
  $("more").hidden = !more;
  const counts = {};
  for (const b of batches) counts[b.status] = (counts[b.status] || 0) + 1;
  $("summary").replaceChildren(...Object.entries(counts).map(([s, n]) => h("span", { class: "chip" },
    `${n} ${label(s)}`)));
  tickTimes();
}

const listView = {
  section: "board",
  async load() {
    const { batches, more } = await loadBatches();
    render(batches, more);
  },
  clear() {
    for (const entry of shown.values()) entry.el.remove();
    shown.clear();
  },
};

$("more").addEventListener("click", () => { wanted += PAGE; refresh(); });
