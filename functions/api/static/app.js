"use strict";
// The session (key in sessionStorage), which view this URL shows, and the polling loop. Runs last.
const BATCH_ID = (() => {
  const m = location.pathname.match(/\/dashboard\/batches\/([^/]+)\/?$/);
  return m ? decodeURIComponent(m[1]) : null;
})();
const view = BATCH_ID ? batchView : listView;
$("home").href = $("back").href = BASE + "/dashboard";
let timer = null;

async function refresh() {
  clearTimeout(timer);
  if (!sessionStorage.getItem(KEY_SLOT)) return;
  let again = true;
  try {
    again = (await view.load()) !== false;
    $("updated").textContent = "live · updated " + new Date().toLocaleTimeString();
    $("updated").classList.remove("stale");
    if ($("notice").classList.contains("bad") && $("notice").dataset.kind === "poll") notice("");
  } catch (e) {
    if (e.status === 401) { signOut(e.message); return; }
    $("updated").classList.add("stale");
    notice("Could not refresh: " + e.message, true);
    $("notice").dataset.kind = "poll";
  }
  if (again) timer = setTimeout(poll, POLL_MS);
  else $("updated").textContent = "up to date · " + new Date().toLocaleTimeString();
}

function poll() {
  if (document.hidden) { timer = setTimeout(poll, POLL_MS); return; }
  refresh();
}

async function cancel(id, button) {
  if (!confirm(`Cancel batch ${id}? Requests not yet run will not be run.`)) return;
  button.disabled = true;
  button.textContent = "Cancelling…";
  try {
    await api("POST", `/batches/${encodeURIComponent(id)}/cancel`);
    notice(`Cancelling ${id}. Finished requests stay in its output file.`);
    $("notice").dataset.kind = "action";
  } catch (e) {
    notice(`Could not cancel ${id}: ${e.message}`, true);
    $("notice").dataset.kind = "action";
    button.disabled = false;
    button.textContent = "Cancel";
  }
  refresh();
}

function showBoard() {
  $("login").hidden = true;
  $("board").hidden = true;
  $("batch-view").hidden = true;
  $(view.section).hidden = false;
  $("session").hidden = false;
  refresh();
}

function signOut(message) {
  clearTimeout(timer);
  sessionStorage.removeItem(KEY_SLOT);
  view.clear();
  notice("");
  $("board").hidden = true;
  $("batch-view").hidden = true;
  $("session").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = message || "";
  $("login-error").hidden = !message;
  $("key").value = "";
  $("key").focus();
}

$("login-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const key = $("key").value.trim();
  if (!key) return;
  sessionStorage.setItem(KEY_SLOT, key);
  try {
    await api("GET", "/batches?limit=1");
  } catch (e) {
    sessionStorage.removeItem(KEY_SLOT);
    $("login-error").textContent = e.status === 401 ? "That API key was not accepted." : e.message;
    $("login-error").hidden = false;
    return;
  }
  $("login-error").hidden = true;
  showBoard();
});
$("signout").addEventListener("click", () => signOut(""));
$("refresh").addEventListener("click", () => refresh());
document.addEventListener("visibilitychange", () => { if (!document.hidden) refresh(); });

if (sessionStorage.getItem(KEY_SLOT)) showBoard();
else signOut("");
