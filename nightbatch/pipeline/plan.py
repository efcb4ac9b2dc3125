"""Plan: group Validate's segments into shards of similar estimated work and write the Map's manifest."""

from __future__ import annotations

from typing import Literal

from nightbatch import layout
from nightbatch.aws.records import BatchRecord
from nightbatch.clock import now
from nightbatch.models.spec import served_model
from nightbatch.pipeline.payloads import BatchTaskInput, PlanOutput
from nightbatch.pipeline.placement import place_by_model, place_by_prefix
from nightbatch.pipeline.sizing import plan_shards
from nightbatch.settings import Settings
from nightbatch.settings import document as settings_document
from nightbatch.shards.index import SegmentEntry, read_segments
from nightbatch.shards.spec import ShardItem, shard_spec, write_manifest, write_shard
from nightbatch.wiring import Services

BackendName = Literal["batch", "sagemaker", "endpoint"]
GpuFallback = Literal["", "batch", "sagemaker"]


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


def by_served_model(segments: list[SegmentEntry], batch_model: str,
                    settings: Settings) -> dict[str, list[SegmentEntry]]:
    """The segments per served model (an adapter's lines go with its model): the batch's model first, then in
    segment order. Segments written before they named their model (model "") are the batch's model's."""
    models = settings.serving.models
    served: dict[str, str] = {}
    first = served_model(models, batch_model)
    out: dict[str, list[SegmentEntry]] = {first.name: []} if first is not None else {}
    for seg in segments:
        name = seg.model or batch_model
        if name not in served:
            spec = served_model(models, name)
            # A model no longer configured keeps its own name: the worker then fails its shards visibly.
            served[name] = spec.name if spec is not None else name
        out.setdefault(served[name], []).append(seg)
    return {model: own for model, own in out.items() if own}


def line_models(group: list[SegmentEntry], model: str) -> dict[str, int]:
    """ShardSpec.models: lines per `body.model` when any names other than the shard's model."""
    counts: dict[str, int] = {}
    for s in group:
        counts[s.model or model] = counts.get(s.model or model, 0) + s.lines
    return {} if set(counts) <= {model} else counts


def plan_batch(inp: BatchTaskInput, services: Services) -> PlanOutput:
    settings, table, blobs = services.settings, services.adapters.table, services.adapters.blobs
    batch = table.get_record(BatchRecord, inp.batch_id)
    items: list[ShardItem] = []
    on_sagemaker: set[str] = set()  # models whose shards may run on SageMaker
    if batch is not None and batch.status == "in_progress":
        index = read_segments(blobs, inp.batch_id)
        job_definitions, backends = settings.pipeline.job_definitions, settings.pipeline.backends
        window = max(0.0, float(batch.expires_at) - now()) if batch.expires_at else None
        # Each shard serves one model (one engine); a model's shards are numbered together.
        by_model = by_served_model(index.segments, batch.model or "", settings)
        if any(backends.get(model, "batch") != "batch" for model in by_model):
            # Its SageMaker jobs read the deployment's settings from the bucket.
            blobs.put_bytes(layout.worker_settings_key(inp.batch_id), settings_document.dump(settings),
                            content_type="application/json")
        for model, own in by_model.items():
            backend = backends.get(model, "batch")
            if backend != "batch":
                on_sagemaker.add(model)
            first, gpu_fallback = first_backend(settings, model, backend)
            # fleet's sizing decides how many shards; placement decides which segments go in each.
            shards = group_segments(own, settings, window)
            placed = place_by_model(shards) if len({s.model for s in own}) > 1 else place_by_prefix(shards)
            for group in placed:
                shard_id = f"{len(items):05d}"
                spec = shard_spec(index, group, batch_id=inp.batch_id, shard_id=shard_id,
                                  endpoint=batch.endpoint, model=model)
                spec.models = line_models(group, model)
                spec.tenant = batch.tenant
                write_shard(blobs, spec)
                items.append(ShardItem(batch_id=inp.batch_id, shard_id=shard_id,
                                       job_definition=job_definitions.get(model, ""),
                                       est_tokens=spec.est_tokens, lines=spec.lines,
                                       backend=first, fallback=backend == "both", gpu_fallback=gpu_fallback))
    # Cancelled or expired before planning: an empty manifest sends the workflow straight to Finalize.
    manifest_key = write_manifest(blobs, inp.batch_id, items)
    if batch is not None:
        table.update_attributes(BatchRecord, inp.batch_id, set_={"shard_count": len(items)})
    return PlanOutput(batch_id=inp.batch_id, manifest_bucket=settings.deployment.bucket, manifest_key=manifest_key,
                      shard_count=len(items), max_concurrency=max_concurrency(settings, on_sagemaker))


def first_backend(settings: Settings, model: str, gpu_backend: str) -> tuple[BackendName, GpuFallback]:
    """Where a model's shards start, and the GPU backend an endpoint shard moves to (nightbatch/shards/pace.py):
    a model with an `endpoint` starts there and, if it has weights of its own, falls back to its `gpuBackend`."""
    gpu: Literal["batch", "sagemaker"] = "sagemaker" if gpu_backend == "sagemaker" else "batch"
    spec = settings.serving.model(model)
    if spec is not None and spec.endpoint is not None:
        return "endpoint", gpu if spec.has_weights else ""
    return gpu, ""


def max_concurrency(settings: Settings, models: set[str]) -> int:
    """max_gpus, capped by the SageMaker quota (`max_jobs`) of each model whose shards may run there: jobs over
    the quota would only be refused and wait. Never 0, which the Map reads as "no limit"."""
    caps = settings.capacity.sagemaker.max_jobs if models else {}
    return max(1, min([settings.pipeline.max_gpus, *(caps[m] for m in models if caps.get(m))]))
