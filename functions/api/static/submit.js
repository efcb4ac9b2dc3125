"use strict";
// New batch: drop or pick a JSONL file, it uploads at once (one request when small, else the Uploads API in
// parts) with a progress bar; the endpoint comes from its first line; window and metadata; the dry-run
// estimate when this deployment answers POST /v1/nightbatch/estimate; create, then the batch's own page.
const SINGLE_MAX = 3 * 1024 * 1024;  // under the 4 MiB request limit of POST /v1/files, with form overhead
const PART_BYTES = 3 * 1024 * 1024;  // each POST /v1/uploads/{id}/parts likewise
const KNOWN_ENDPOINTS = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/score",
  "/v1/rerank"];
let uploaded = null;  // {file, fileId} once the chosen file is on the server
let uploading = null;  // the XMLHttpRequest in flight, to abort
let generation = 0;  // a newer file choice makes an older upload's answers stale

// XMLHttpRequest, not fetch: it reports upload progress.
function send(method, path, body, onProgress) {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    uploading = xhr;
    xhr.open(method, API + path);
    xhr.setRequestHeader("Authorization", "Bearer " + sessionStorage.getItem(KEY_SLOT));
    xhr.upload.onprogress = (e) => { if (e.lengthComputable && onProgress) onProgress(e.loaded); };
    xhr.onload = () => {
      let data = null;
      try { data = JSON.parse(xhr.responseText); } catch (e) { /* not JSON */ }
      if (xhr.status >= 200 && xhr.status < 300) resolve(data);
      else reject(new ApiError(xhr.status, (data && data.error && data.error.message) || "HTTP " + xhr.status));
    };
    xhr.onerror = () => reject(new ApiError(0, "Cannot reach the server."));
    xhr.onabort = () => reject(new ApiError(-1, "Upload cancelled."));
    xhr.send(body);
  });
}

function progress(done, total) {
  const pct = total ? Math.min(100, Math.floor(100 * done / total)) : 100;
  $("upload-progress").hidden = false;
  $("upload-progress").value = pct;
  $("upload-text").textContent = pct < 100 ? `Uploading… ${pct}%` : "Uploaded.";
}

async function uploadFile(file) {
  if (file.size <= SINGLE_MAX) {
    const form = new FormData();
    form.append("purpose", "batch");
    form.append("file", file, file.name);
    const f = await send("POST", "/files", form, (n) => progress(Math.min(n, file.size), file.size));
    return f.id;
  }
  const up = await api("POST", "/uploads", { bytes: file.size, filename: file.name, purpose: "batch",
    mime_type: "text/jsonl" });
  const parts = [];
  for (let start = 0; start < file.size; start += PART_BYTES) {
    const form = new FormData();
    form.append("data", file.slice(start, start + PART_BYTES), file.name);
    const part = await send("POST", `/uploads/${up.id}/parts`, form,
      (n) => progress(start + Math.min(n, PART_BYTES), file.size));
    parts.push(part.id);
    progress(Math.min(file.size, start + PART_BYTES), file.size);
  }
  const done = await api("POST", `/uploads/${up.id}/complete`, { part_ids: parts });
  return done.file.id;
}

// The first line names the endpoint (and the model): read only the file's first 64 KiB for it.
async function firstLine(file) {
  const head = await file.slice(0, 64 * 1024).text();
  const line = head.split("\n", 1)[0].trim();
  try { return JSON.parse(line); } catch (e) { return null; }
}

function submitError(message) {
  $("submit-error").textContent = message || "";
  $("submit-error").hidden = !message;
}

function chooseEndpoint(url) {
  const select = $("endpoint");
  if (url && !KNOWN_ENDPOINTS.includes(url) && ![...select.options].some((o) => o.value === url)) {
    select.append(h("option", { value: url }, url));
  }
  if (url) select.value = url;
}

async function estimate(fileId) {
  const box = $("estimate");
  box.hidden = true;
  let e;
  try {
    e = await api("POST", "/nightbatch/estimate", { input_file_id: fileId, endpoint: $("endpoint").value,
      completion_window: $("window").value });
  } catch (err) {
    return;  // no estimate on this deployment (404), or none for this file: nothing to show
  }
  if (!e || e.object !== "nightbatch.estimate") return;
  const cost = e.cost_usd && typeof e.cost_usd === "object"
    ? Object.entries(e.cost_usd).map(([k, v]) => `${money(v)} ${k}`).join(" · ") : money(e.cost_usd);
  const rows = [
    ["Requests", num(e.requests)],
    ["Tokens (approximate)", `in ${num(e.input_tokens)} · out up to ${num(e.expected_output_tokens)}`],
    ["GPU-seconds", typeof e.gpu_seconds === "number" ? e.gpu_seconds.toFixed(1) : "—"],
    ["Cost", cost || "—"],
    ["Queue ahead", typeof e.queue_ahead_seconds === "number" ? duration(e.queue_ahead_seconds) : "—"],
    ["Fits the window", e.window_feasible === false ? "no" : e.window_feasible ? "yes" : "—"],
  ];
  const errors = e.errors || [];
  box.replaceChildren(h("h3", {}, "Estimate"), h("dl", { class: "stats" },
    rows.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])),
    errors.length ? h("p", { class: "error" }, "The file has errors; the batch would fail validation:") : null,
    errors.length ? h("ul", { class: "line-errors" }, errors.slice(0, 20).map((x) => h("li", {},
      h("span", { class: "line" }, x.line ? "line " + x.line : ""), h("code", {}, x.code), x.message))) : null);
  box.hidden = false;
}

async function pick(file) {
  const mine = ++generation;
  if (uploading) uploading.abort();
  uploaded = null;
  submitError("");
  $("estimate").hidden = true;
  $("create").disabled = true;
  $("file-info").textContent = `${file.name} · ${num(file.size)} bytes`;
  const first = await firstLine(file);
  if (mine !== generation) return;
  if (first && typeof first.url === "string") chooseEndpoint(first.url);
  else $("file-info").textContent += " · line 1 is not a request (the server will say what is wrong)";
  progress(0, file.size);
  try {
    const fileId = await uploadFile(file);
    if (mine !== generation) return;
    uploaded = { file, fileId };
    $("upload-text").textContent = `Uploaded as ${fileId}.`;
    $("create").disabled = false;
    estimate(fileId);
  } catch (e) {
    if (mine !== generation || e.status === -1) return;
    $("upload-progress").hidden = true;
    $("upload-text").textContent = "";
    submitError("Upload failed: " + e.message);
  } finally {
    if (mine === generation) uploading = null;
  }
}

function metadataRow() {
  const n = $("meta-rows").children.length + 1;
  const remove = h("button", { type: "button", "aria-label": `Remove metadata pair ${n}`,
    onclick: (e) => e.currentTarget.parentElement.remove() }, "×");
  return h("div", { class: "meta-row" },
    h("input", { type: "text", class: "meta-key", "aria-label": `Metadata key ${n}`, placeholder: "key", maxlength: "64" }),
    h("input", { type: "text", class: "meta-value", "aria-label": `Metadata value ${n}`, placeholder: "value",
      maxlength: "512" }),
    remove);
}

async function create(event) {
  event.preventDefault();
  if (!uploaded) return;
  const metadata = {};
  for (const r of $("meta-rows").children) {
    const k = r.querySelector(".meta-key").value.trim();
    if (k) metadata[k] = r.querySelector(".meta-value").value;
  }
  $("create").disabled = true;
  submitError("");
  try {
    const b = await api("POST", "/batches", { input_file_id: uploaded.fileId, endpoint: $("endpoint").value,
      completion_window: $("window").value, metadata: Object.keys(metadata).length ? metadata : null });
    location.assign(batchUrl(b.id));
  } catch (e) {
    submitError("Could not create the batch: " + e.message);
    $("create").disabled = false;
  }
}

function openSubmit(file) {
  const dialog = $("submit");
  if (!dialog.open) {
    generation++;
    if (uploading) uploading.abort();
    uploaded = null;
    $("submit-form").reset();
    $("meta-rows").replaceChildren();
    $("meta-rows").append(metadataRow());
    $("file-info").textContent = "No file chosen.";
    $("upload-progress").hidden = true;
    $("upload-text").textContent = "";
    $("estimate").hidden = true;
    $("create").disabled = true;
    submitError("");
    dialog.showModal();
  }
  if (file) pick(file);
}

function closeSubmit() {
  $("submit").close();
}

$("new-batch").addEventListener("click", () => openSubmit(null));
$("submit-close").addEventListener("click", closeSubmit);
// Closed by the button or Escape: an upload still running is abandoned.
$("submit").addEventListener("close", () => { generation++; if (uploading) uploading.abort(); });
$("submit-form").addEventListener("submit", create);
$("add-meta").addEventListener("click", () => { const r = metadataRow(); $("meta-rows").append(r); r.firstChild.focus(); });
$("file").addEventListener("change", (e) => { if (e.target.files.length) pick(e.target.files[0]); });
// A file dropped anywhere on the page (when signed in) opens the dialog with it.
document.addEventListener("dragover", (e) => {
  if (!sessionStorage.getItem(KEY_SLOT) || !e.dataTransfer.types.includes("Files")) return;
  e.preventDefault();
  $("drop").classList.add("over");
});
document.addEventListener("dragleave", (e) => { if (!e.relatedTarget) $("drop").classList.remove("over"); });
document.addEventListener("drop", (e) => {
  if (!sessionStorage.getItem(KEY_SLOT) || !e.dataTransfer.files.length) return;
  e.preventDefault();
  $("drop").classList.remove("over");
  openSubmit(e.dataTransfer.files[0]);
});
