"""Plan: group Validate's segments into shards of similar estimated work and write the Map's manifest."""

from __future__ import annotations

import json
from typing import Any

from nightbatch.clock import now
from nightbatch.pipeline import layout
from nightbatch.pipeline.models import BatchTaskInput, PlanOutput, ShardItem
from nightbatch.pipeline.placement import place_by_prefix
from nightbatch.pipeline.sizing import plan_shards
from nightbatch.services import Services
from nightbatch.settings import Settings


def group_segments(
    segments: list[dict[str, Any]], settings: Settings, window_seconds: float | None = None
) -> list[list[dict[str, Any]]]:
    """Contiguous groups of whole segments, each near total/n estimated tokens; n from sizing.plan_shards."""
    if not segments:
        return []
    total = sum(int(s["est"]) for s in segments)
    n = plan_shards(total, len(segments), settings, window_seconds).shards
    target = total / n
    groups: list[list[dict[str, Any]]] = [[]]
    acc = 0
    for i, seg in enumerate(segments):
        remaining_segments = len(segments) - i
        remaining_groups = n - len(groups)
        if groups[-1] and (acc >= target or remaining_segments <= remaining_groups) and remaining_groups > 0:
            groups.append([])
            acc = 0
        groups[-1].append(seg)
        acc += int(seg["est"])
    return groups


def plan_batch(inp: BatchTaskInput, services: Services) -> PlanOutput:
    settings, table, blobs = services.settings, services.adapters.table, services.adapters.blobs
    batch = table.get(inp.batch_id)
    manifest_key = layout.manifest_key(inp.batch_id)
    items: list[dict[str, Any]] = []
    if batch is not None and batch["status"] == "in_progress":
        raw = blobs.get_bytes(layout.segment_index_key(inp.batch_id))
        segments: list[dict[str, Any]] = json.loads(raw) if raw else []
        job_definitions: dict[str, str] = json.loads(settings.job_definitions_json or "{}")
        job_definition = job_definitions.get(batch["model"], "")
        window = max(0.0, float(batch.get("expires_at") or 0) - now()) if batch.get("expires_at") else None
        # fleet's sizing decides how many shards; placement decides which segments go in each.
        for i, group in enumerate(place_by_prefix(group_segments(segments, settings, window))):
            shard_id = f"{i:05d}"
            blobs.put_bytes(layout.shard_key(inp.batch_id, shard_id), json.dumps({
                "version": 1, "batch_id": inp.batch_id, "shard_id": shard_id,
                "endpoint": batch["endpoint"], "model": batch["model"],
                "segments": [s["key"] for s in group], "lines": sum(int(s["lines"]) for s in group),
                "est_tokens": sum(int(s["est"]) for s in group),
            }).encode())
            items.append(ShardItem(batch_id=inp.batch_id, shard_id=shard_id,
                                   job_definition=job_definition).model_dump())
    # Cancelled or expired before planning: an empty manifest sends the workflow straight to Finalize.
    blobs.put_bytes(manifest_key, json.dumps(items).encode(), content_type="application/json")
    if batch is not None:
        table.update(inp.batch_id, set_={"shard_count": len(items)})
    return PlanOutput(batch_id=inp.batch_id, manifest_bucket=settings.bucket, manifest_key=manifest_key,
                      shard_count=len(items))
