"""Plan: group Validate's segments into shards of similar estimated work and write the Map's manifest."""

from __future__ import annotations

import json
import math

from nightbatch import layout
from nightbatch.layout import SegmentEntry, ShardItem
from nightbatch.pipeline.models import BatchTaskInput, PlanOutput
from nightbatch.services import Services
from nightbatch.settings import Settings


def group_segments(segments: list[SegmentEntry], settings: Settings) -> list[list[SegmentEntry]]:
    """Contiguous groups of whole segments, each near total/n estimated tokens."""
    if not segments:
        return []
    total = sum(s.est for s in segments)
    cap = max(1, settings.max_gpus * settings.shards_per_gpu)
    n = max(1, min(cap, math.ceil(total / max(1, settings.shard_target_tokens)), len(segments)))
    target = total / n
    groups: list[list[SegmentEntry]] = [[]]
    acc = 0
    for i, seg in enumerate(segments):
        remaining_segments = len(segments) - i
        remaining_groups = n - len(groups)
        if groups[-1] and (acc >= target or remaining_segments <= remaining_groups) and remaining_groups > 0:
            groups.append([])
            acc = 0
        groups[-1].append(seg)
        acc += seg.est
    return groups


def plan_batch(inp: BatchTaskInput, services: Services) -> PlanOutput:
    settings, table, blobs = services.settings, services.adapters.table, services.adapters.blobs
    batch = table.get(inp.batch_id)
    items: list[ShardItem] = []
    if batch is not None and batch["status"] == "in_progress":
        segments = layout.read_segment_index(blobs, inp.batch_id)
        job_definitions: dict[str, str] = json.loads(settings.job_definitions_json or "{}")
        job_definition = job_definitions.get(batch["model"], "")
        for i, group in enumerate(group_segments(segments, settings)):
            shard_id = f"{i:05d}"
            layout.write_shard(blobs, layout.ShardSpec(
                batch_id=inp.batch_id, shard_id=shard_id, endpoint=batch["endpoint"], model=batch["model"],
                segments=[s.key for s in group], lines=sum(s.lines for s in group),
                est_tokens=sum(s.est for s in group),
            ))
            items.append(ShardItem(batch_id=inp.batch_id, shard_id=shard_id, job_definition=job_definition))
    # Cancelled or expired before planning: an empty manifest sends the workflow straight to Finalize.
    manifest_key = layout.write_manifest(blobs, inp.batch_id, items)
    if batch is not None:
        table.update(inp.batch_id, set_={"shard_count": len(items)})
    return PlanOutput(batch_id=inp.batch_id, manifest_bucket=settings.bucket, manifest_key=manifest_key,
                      shard_count=len(items))
