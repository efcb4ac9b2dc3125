"""What the dashboard's batch page shows beyond the Batch object: shards, progress over time, notifications.

Everything here is read from records other steps already write (Plan's shard definitions, the workers'
checkpoints, accounting and progress samples, Notify's event and delivery items); nothing is recomputed from
the result files. The reads are bounded: at most MAX_SHARDS shards, each a listing and a few small objects.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from nightbatch import layout
from nightbatch.aws import BlobStore
from nightbatch.aws.records import BatchRecord, DeliveryRecord, EventRecord
from nightbatch.notifications.delivery import delivery_id
from nightbatch.notifications.delivery import to_wire as delivery_to_wire
from nightbatch.notifications.endpoints import WebhookEndpointService
from nightbatch.notifications.events import event_pk
from nightbatch.wire import TERMINAL_STATUSES
from nightbatch.wiring import Services

MAX_SHARDS = 100
MAX_POINTS = 400


def _json(blobs: BlobStore, key: str) -> Any:
    raw = blobs.get_bytes(key)
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _shard(blobs: BlobStore, batch_id: str, shard_id: str, terminal: bool) -> dict[str, Any]:
    spec = _json(blobs, layout.shard_key(batch_id, shard_id)) or {}
    prefix = layout.results_prefix(batch_id, shard_id)
    attempts: dict[str, dict[str, Any]] = {}
    checkpoints = 0
    done = None
    samples: list[list[list[float]]] = []
    for key in blobs.list_keys(prefix):
        name = key[len(prefix):]
        if name == layout.DONE_NAME:
            done = _json(blobs, key) or {}
        elif m := layout.CHECKPOINT_RE.fullmatch(name):
            checkpoints += 1
            attempts.setdefault(m.group(2), {"attempt": m.group(2)})
        elif m := layout.ACCOUNTING_RE.fullmatch(name):
            record = _json(blobs, key) or {}
            # Phase timings as the worker reports them (load, inference, idle and any it adds later).
            timings = {k: v for k, v in record.items() if k.endswith("_seconds") and isinstance(v, int | float)}
            entry = attempts.setdefault(m.group(1), {"attempt": m.group(1)})
            entry.update(timings, finished=bool(record.get("finished")))
            phases = record.get("phases")
            if isinstance(phases, dict):  # seconds from container start to each phase (nightbatch.phases)
                entry["phases"] = {k: v for k, v in phases.items()
                                   if isinstance(v, int | float) or k == "weights_source"}
        elif m := layout.PROGRESS_RE.fullmatch(name):
            record = _json(blobs, key) or {}
            points = [p for p in record.get("samples", []) if isinstance(p, list) and len(p) == 4]
            if points:
                samples.append(points)
                entry = attempts.setdefault(m.group(1), {"attempt": m.group(1)})
                entry["first_result_at"] = points[0][0]
                entry["last_result_at"] = points[-1][0]
    if done is not None:
        state = "completed"
    elif attempts:
        state = "stopped" if terminal else "running"
    else:
        state = "not_started" if terminal else "pending"
    return {
        "shard_id": shard_id, "state": state, "lines": spec.get("lines"), "est_tokens": spec.get("est_tokens"),
        "attempts": sorted(attempts.values(), key=lambda a: a.get("first_result_at") or 0),
        "checkpoints": checkpoints, "done": done, "_samples": samples,
    }


def progress_series(per_attempt: list[list[list[float]]]) -> list[list[float]]:
    """Merges every attempt's cumulative samples into one cumulative series over time:
    [unix time, completed, failed, output tokens]."""
    deltas: list[tuple[float, float, float, float]] = []
    for samples in per_attempt:
        prev = [0.0, 0.0, 0.0]
        for t, ok, bad, out in samples:
            deltas.append((t, ok - prev[0], bad - prev[1], out - prev[2]))
            prev = [ok, bad, out]
    deltas.sort()
    series: list[list[float]] = []
    total = [0.0, 0.0, 0.0]
    for t, ok, bad, out in deltas:
        total = [total[0] + ok, total[1] + bad, total[2] + out]
        if series and series[-1][0] == t:
            series[-1] = [t, *total]
        else:
            series.append([t, *total])
    if len(series) > MAX_POINTS:
        step = len(series) / MAX_POINTS
        series = [series[int(i * step)] for i in range(MAX_POINTS - 1)] + [series[-1]]
    return series


def notifications(services: Services, batch: BatchRecord) -> dict[str, Any]:
    """The terminal event's webhook deliveries (with every attempt), e-mails and SNS message, if sent yet."""
    table = services.adapters.table
    event = (table.get_record(EventRecord, event_pk(batch.pk, batch.status))
             if batch.status in TERMINAL_STATUSES else None)
    if event is None:
        return {"event": None, "webhooks": [], "emails": [], "sns_message_id": None}
    webhooks = []
    endpoints = WebhookEndpointService(settings=services.settings, table=table)
    for endpoint in endpoints.all_items(batch.tenant):
        rec = table.get_owned(DeliveryRecord, batch.tenant, delivery_id(event.event_id, endpoint.pk))
        if rec is not None:
            wire = delivery_to_wire(rec).model_dump()
            wire["url"] = endpoint.url
            webhooks.append(wire)
    emails = [{"to": a, "status": "sent"} for a in event.emailed_to or []]
    emails += [{"to": a, "status": "rejected"} for a in event.email_rejected or []]
    return {"event": {"id": event.event_id, "type": event.type, "created_at": event.created_at},
            "webhooks": webhooks, "emails": emails, "sns_message_id": event.sns_message_id}


def batch_detail(services: Services, tenant: str, batch_id: str) -> dict[str, Any]:
    batch = services.batches.item(tenant, batch_id)  # 404 unless the caller's tenant owns it
    blobs = services.adapters.blobs
    manifest = _json(blobs, layout.manifest_key(batch_id)) if batch.status != "validating" else None
    shard_ids = [str(s["shard_id"]) for s in manifest or [] if isinstance(s, dict) and "shard_id" in s]
    terminal = batch.status in TERMINAL_STATUSES
    shown = shard_ids[:MAX_SHARDS]
    with ThreadPoolExecutor(max_workers=8) as pool:
        shards = list(pool.map(lambda sid: _shard(blobs, batch_id, sid, terminal), shown))
    series = progress_series([s for shard in shards for s in shard.pop("_samples")])
    return {
        "object": "nightbatch.batch_detail", "id": batch_id, "status": batch.status,
        "shard_count": len(shard_ids), "shards": shards, "shards_truncated": len(shard_ids) > len(shown),
        "progress": {"columns": ["time", "completed", "failed", "output_tokens"], "points": series},
        "notifications": notifications(services, batch),
    }
