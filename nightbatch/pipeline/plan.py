"""Plan: group Validate's segments into shards of similar estimated work and write the Map's manifest."""

from __future__ import annotations

import json

from nightbatch import layout
from nightbatch.clock import now
from nightbatch.layout import SegmentEntry, ShardItem
from nightbatch.pipeline.models import BatchTaskInput, PlanOutput
from nightbatch.pipeline.placement import place_by_prefix
from nightbatch.pipeline.sizing import plan_shards
from nightbatch.services import Services
from nightbatch.settings import Settings
from nightbatch.settings import document as settings_document
from nightbatch.storage.records import BatchRecord


def group_segments(
    segments: list[SegmentEntry], settings: Settings, window_seconds: float | None = None
) -> list[list[SegmentEntry]]:
    """Contiguous groups of whole segments, each near total/n estimated tokens; n from sizing.plan_shards."""
    if not segments:
        return []
    total = sum(s.est for s in segments)
    n = plan_shards(total, len(segments), settings, window_seconds).shards
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
    batch = table.get_record(BatchRecord, inp.batch_id)
    items: list[ShardItem] = []
    if batch is not None and batch.status == "in_progress":
        model = batch.model or ""
        index = layout.read_segments(blobs, inp.batch_id)
        segments = index.segments
        job_definitions: dict[str, str] = json.loads(settings.pipeline.job_definitions_json or "{}")
        job_definition = job_definitions.get(model, "")
        backend = json.loads(settings.pipeline.backends_json or "{}").get(model, "batch")
        if backend != "batch":  # its SageMaker jobs read the deployment's settings from the bucket
            blobs.put_bytes(layout.worker_settings_key(inp.batch_id), settings_document.dump(settings),
                            content_type="application/json")
        window = max(0.0, float(batch.expires_at) - now()) if batch.expires_at else None
        # fleet's sizing decides how many shards; placement decides which segments go in each.
        for i, group in enumerate(place_by_prefix(group_segments(segments, settings, window))):
            shard_id = f"{i:05d}"
            layout.write_shard(blobs, layout.shard_spec(index, group, batch_id=inp.batch_id, shard_id=shard_id,
                                                        endpoint=batch.endpoint, model=model))
            items.append(ShardItem(batch_id=inp.batch_id, shard_id=shard_id, job_definition=job_definition,
                                   est_tokens=sum(s.est for s in group),
                                   backend="sagemaker" if backend == "sagemaker" else "batch",
                                   fallback=backend == "both"))
    # Cancelled or expired before planning: an empty manifest sends the workflow straight to Finalize.
    manifest_key = layout.write_manifest(blobs, inp.batch_id, items)
    if batch is not None:
        table.update_attributes(BatchRecord, inp.batch_id, set_={"shard_count": len(items)})
    return PlanOutput(batch_id=inp.batch_id, manifest_bucket=settings.deployment.bucket, manifest_key=manifest_key,
                      shard_count=len(items))
