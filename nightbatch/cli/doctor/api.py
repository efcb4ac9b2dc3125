"""The doctor's checks through the API alone: the key, the models, and one one-line batch per model and endpoint.

Everything here is what any user of the stock OpenAI SDK can see; the AWS side (`aws.py`) adds the job phases.
"""

from __future__ import annotations

import io
import json
import time
from typing import Any

import openai
from openai.types import Batch

from nightbatch.cli.doctor.report import Check, Probe
from nightbatch.models.spec import ENDPOINTS
from nightbatch.wire import TERMINAL_STATUSES

PROMPT = "Reply with the single word OK."
MAX_TOKENS = 8
INVALID_KEY = "nb-doctor-not-a-key"


def check_key(client: openai.OpenAI) -> Check:
    """The key is accepted, and a wrong key is refused (so authentication is on)."""
    try:
        client.models.list()
    except openai.AuthenticationError as e:
        return Check("API key", "failed", f"refused (HTTP {e.status_code})",
                     "use a key the deployment knows: after `cdk deploy` the first key is in the secret named by "
                     "the stack's ApiKeysSecret output (`aws secretsmanager get-secret-value --secret-id ARN`); "
                     "`nightbatch local` prints its key when it starts")
    tenant = ""
    try:
        limits = client.get("/nightbatch/limits", cast_to=dict[str, Any])
        tenant = f" (tenant {limits.get('tenant')})" if isinstance(limits, dict) and limits.get("tenant") else ""
    except openai.APIStatusError:
        pass  # an older server without /v1/nightbatch/limits: the key still works
    try:
        client.with_options(api_key=INVALID_KEY, max_retries=0).models.list()
    except openai.AuthenticationError:
        return Check("API key", "ok", f"accepted{tenant}; a wrong key is refused")
    return Check("API key", "warn", f"accepted{tenant}, but so is a made-up key",
                 "the API does not check keys: set NIGHTBATCH_API_KEYS / the ApiKeysSecret before exposing it")


def served_models(client: openai.OpenAI) -> tuple[Check, list[tuple[str, tuple[str, ...] | None]]]:
    """Each model with the endpoints it serves (`model.nightbatch.endpoints`; None when the server does not say)."""
    models: list[tuple[str, tuple[str, ...] | None]] = []
    for m in client.models.list():
        ext = (m.model_extra or {}).get("nightbatch")
        endpoints = ext.get("endpoints") if isinstance(ext, dict) else None
        models.append((m.id, tuple(endpoints) if isinstance(endpoints, list) else None))
    if not models:
        return Check("models", "failed", "the deployment serves no models",
                     "add models to cdk.json context `models` (or NIGHTBATCH_MODELS_JSON) and deploy again"), []
    names = ", ".join(f"{name} ({', '.join(e.removeprefix('/v1/') for e in eps)})" if eps else name
                      for name, eps in models)
    return Check("models", "ok", names), models


def probe_pairs(models: list[tuple[str, tuple[str, ...] | None]]) -> list[tuple[str, str, bool]]:
    """(model, endpoint, certain): a server that does not list endpoints gets every endpoint tried, and a
    probe refused at validation with `model_not_found` is then dropped rather than reported."""
    return [(name, endpoint, eps is not None) for name, eps in models for endpoint in (eps or ENDPOINTS)]


def request_line(model: str, endpoint: str) -> dict[str, Any]:
    if endpoint == "/v1/embeddings":
        body: dict[str, Any] = {"model": model, "input": PROMPT}
    elif endpoint == "/v1/score":
        body = {"model": model, "text_1": PROMPT, "text_2": PROMPT}
    elif endpoint == "/v1/rerank":
        body = {"model": model, "query": PROMPT, "documents": [PROMPT]}
    elif endpoint == "/v1/completions":
        body = {"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0}
    elif endpoint == "/v1/chat/completions":
        body = {"model": model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": MAX_TOKENS,
                "temperature": 0}
    else:  # e.g. /v1/responses
        body = {"model": model, "input": PROMPT, "max_output_tokens": MAX_TOKENS, "temperature": 0}
    return {"custom_id": "doctor-1", "method": "POST", "url": endpoint, "body": body}


def create_probe(client: openai.OpenAI, probe: Probe) -> Batch:
    data = (json.dumps(request_line(probe.model, probe.endpoint)) + "\n").encode()
    probe.created_at = time.time()
    f = client.files.create(file=("nightbatch-doctor.jsonl", io.BytesIO(data)), purpose="batch")
    batch = client.batches.create(input_file_id=f.id, endpoint=probe.endpoint,  # type: ignore[arg-type]
                                  completion_window="24h", metadata={"nightbatch_doctor": "1"})
    probe.batch_id, probe.status = batch.id, batch.status
    return batch


def extension(batch: Batch) -> dict[str, Any]:
    ext = (batch.model_extra or {}).get("nightbatch")
    return ext if isinstance(ext, dict) else {}


def observe(client: openai.OpenAI, probe: Probe, batch: Batch, at: float) -> None:
    """Moves the probe's API-visible phases on from one poll of its batch, `at` seconds after create."""
    probe.status = batch.status
    if batch.status == "failed" or (batch.status in TERMINAL_STATUSES and batch.in_progress_at is None
                                    and batch.status != "completed"):
        errors = batch.errors.data if batch.errors and batch.errors.data else []
        first = errors[0] if errors else None
        detail = f"{first.code}: {first.message}" if first else f"the batch ended {batch.status}"
        probe.fail("validate", detail, "the probe line was refused: check the model's configuration "
                                       "(name, task) against `nightbatch doctor`'s request" if first else "")
        return
    if batch.status != "validating":
        total = batch.request_counts.total if batch.request_counts else 0
        probe.reach("validate", at, detail=f"{total} line valid" if total == 1 else f"{total} lines valid")
    counts = batch.request_counts
    if counts and counts.completed + counts.failed > 0:
        probe.reach("first result", at)
    if batch.status in TERMINAL_STATUSES:
        _finished(client, probe, batch, at)


def _finished(client: openai.OpenAI, probe: Probe, batch: Batch, at: float) -> None:
    if probe.phase("model loaded").status == "pending":
        _model_loaded(probe, extension(batch))
        probe.settle()
    counts = batch.request_counts
    if batch.status != "completed" or counts is None:
        if counts and counts.completed:
            probe.reach("first result", at)
        probe.fail("finalize", f"the batch ended {batch.status}",
                   "it expired or was cancelled before its one line ran: see the phases above")
        return
    if counts.failed:
        probe.reach("first result", at)
        probe.fail("first result", f"the line failed: {_error_line(client, batch)}",
                   "the engine refused the request: check the model's max_model_len and engine_args")
    else:
        probe.reach("first result", at, detail="1 line completed")
    usage = batch.usage.total_tokens if batch.usage else 0
    probe.reach("finalize", at, detail=f"completed, {usage} tokens" + backends_detail(extension(batch)))


def backends_detail(ext: dict[str, Any]) -> str:
    """Which backend ran the batch's lines (`nightbatch.cost.lines_by_backend`) when not AWS Batch alone, and why it
    moved, if it did."""
    cost = ext.get("cost")
    lines = cost.get("lines_by_backend") if isinstance(cost, dict) else None
    text = ""
    if isinstance(lines, dict) and set(lines) - {"batch"}:
        text = "; ran on " + ", ".join(f"{name} ({n} line{'s' if n != 1 else ''})" for name, n in lines.items())
    moved = ext.get("backend_moved")
    if isinstance(moved, dict) and moved.get("to"):
        text += f"; moved to {moved['to']}: {moved.get('reason', '')}"
    return text


def _model_loaded(probe: Probe, ext: dict[str, Any]) -> None:
    """From the worker's own clock: `nightbatch.phases` (container start → weights → engine ready, per attempt),
    else the load seconds in `nightbatch.cost` (older servers)."""
    loaded = probe.phase("model loaded")
    phases = ext.get("phases")
    shards = phases.get("shards") if isinstance(phases, dict) else None
    first = min((a for a in shards or [] if isinstance(a, dict) and isinstance(a.get("engine_ready_s"), int | float)
                 and isinstance(a.get("container_start"), int | float)), key=lambda a: a["container_start"],
                default=None)
    if first is not None:
        engine, start = float(first["engine_ready_s"]), float(first["container_start"])
        loaded.status = "ok"
        # Wall clocks of this machine and the worker's: fine to a second with NTP on both.
        loaded.at = round(max(0.0, start + engine - probe.created_at), 2) if probe.created_at else None
        weights = first.get("weights_ready_s")
        source = first.get("weights_source") or "?"
        loaded.detail = (f"engine ready {engine:.1f} s after the shard started" +
                         (f" (weights {float(weights):.1f} s, from {source})" if isinstance(weights, int | float)
                          else ""))
        return
    cost = ext.get("cost")
    load = cost.get("model_load_seconds") if isinstance(cost, dict) else None
    if not isinstance(load, int | float):
        probe.skip("model loaded", "the server does not report it (batch.nightbatch.phases)")
        return
    running = probe.phase("job RUNNING").at
    loaded.status = "ok"
    loaded.at = round(running + float(load), 2) if running is not None else None
    loaded.detail = "engine already warm" if load < 0.05 else f"{load:.1f} s loading the model (the worker's record)"


def _error_line(client: openai.OpenAI, batch: Batch) -> str:
    if not batch.error_file_id:
        return "no error file"
    try:
        text = client.files.content(batch.error_file_id).text
        row = json.loads(text.splitlines()[0])
    except (openai.OpenAIError, ValueError, IndexError):
        return "unreadable error file"
    error = row.get("error") or ((row.get("response") or {}).get("body") or {}).get("error") or {}
    return f"{error.get('code') or ''} {error.get('message') or row}".strip()[:300]
