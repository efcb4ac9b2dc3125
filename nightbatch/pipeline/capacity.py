"""Capacity: which queue (Spot or on-demand), priority and share each submission of a shard's job gets.

The workflow asks before every submission of a shard (the first, and after each failed attempt):
- Spot first. A batch moves to on-demand when its slack — time left in its window minus the estimated
  remaining work, one cold start included — drops below the margin, or when one of its Spot attempts was
  interrupted (host reclaimed) or sat RUNNABLE past the Spot queue's bound (the queue cancels it with a
  CAPACITY:/MISCONFIGURATION: reason). The move is recorded on the batch, so its remaining shards follow.
- Priority: earliest deadline first. `schedulingPriorityOverride` = 9999 minus the minutes left until the batch
  expires, in tens (a 1 h batch outranks a 24 h batch; it only orders jobs within one share).
- Share: the tenant (AWS Batch fair-share), so one tenant's huge batch cannot starve another's small one.
- Other failures retry on the same capacity with backoff, `shard_retry_attempts` times, then give up (Finalize
  writes the shard's unrun lines as `shard_failed`).
- Backend: the shard's (Plan's manifest item: the model's `gpuBackend`). With `both`, a Batch attempt its queue
  could not place (CAPACITY:/COMPUTE_ENVIRONMENT_MAX_RESOURCE: no capacity, or an EC2 quota of 0) moves the shard
  to SageMaker when Batch has no other capacity to try or the batch's slack is below the margin; the move is
  recorded on the batch (`backend_moved`), so its remaining shards follow. On SageMaker, Spot is managed Spot and
  a Spot attempt that waited past its bound or was reclaimed moves on-demand (nightbatch/pipeline/training_jobs.py).
- Quota: SageMaker refuses a job over the account's quota of its type (`ResourceLimitExceeded`) where Batch would
  queue it. That is a wait for one of the running jobs to end, not a failed attempt: the same capacity (Spot stays
  Spot, the batch stays put) after a growing delay, as long as the shard still fits in the window after it
  (seconds left - the delay - the shard's own work > the margin). Then it is handled as any other end of the
  attempt: Spot moves on-demand (a separate quota), on-demand counts a failure.
- Endpoint: a shard of a model with an `endpoint` runs first on that server, its runner an AWS Batch Fargate job
  (`endpoint_job_queue`). When the runner stops because the window's slack would run out at the endpoint's measured
  pace (nightbatch/shards/pace.py), or its attempts fail past `shard_retry_attempts`, the shard's remaining lines
  move to the model's GPU backend (its manifest item's `gpu_fallback`), recorded on the batch (`backend_moved`,
  `backend_moved_to`), so the batch's shards not yet started go there too. A model without weights of its own
  stays on its endpoint.
Each decision is written next to the shard's results (`capacity-<n>.json`); Finalize lists them in the batch's
`nightbatch.capacity` extension.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel

from nightbatch import layout
from nightbatch.aws.records import BatchRecord
from nightbatch.clock import now
from nightbatch.pipeline import training_jobs
from nightbatch.pipeline.sizing import wall_seconds
from nightbatch.shards.pace import read_pace
from nightbatch.shards.spec import read_manifest, read_shard
from nightbatch.wiring import Services

Capacity = Literal["spot", "on-demand"]
Backend = Literal["batch", "sagemaker", "endpoint"]
# statusReason prefixes that mean "Spot could not hold or place this job": a reclaimed host ("Host EC2...") and
# the RUNNABLE reasons of AWS Batch's job state time limit actions (AWS Batch User Guide).
SPOT_SHORTAGE = ("Host EC2", "CAPACITY:", "MISCONFIGURATION:COMPUTE_ENVIRONMENT_MAX_RESOURCE")
# The longest wait between two submissions refused for the quota (the delay doubles up to it).
QUOTA_WAIT_MAX_SECONDS = 900


class CapacityDecision(BaseModel):
    version: Literal[1] = 1
    action: Literal["run", "give_up"]
    capacity: Capacity
    queue: str
    priority: int
    share: str
    attempt: int  # submissions of this shard so far, this one included
    failures: int  # failed attempts on the current capacity
    quota_waits: int = 0  # submissions refused for the quota in a row (not failures)
    wait_seconds: int
    reason: str
    # The job's retry strategy: none on Spot (a lost host comes back here and moves), host loss retried on-demand.
    retry_strategy: dict[str, Any]
    # Where the attempt runs; a SageMaker attempt's job (nightbatch/pipeline/training_jobs.py).
    backend: Backend = "batch"
    job_name: str = ""
    instance_type: str = ""
    managed_spot: bool = False
    stopping_condition: dict[str, int] = {}
    settings_key: str = ""
    output_uri: str = ""
    job_definition: str = ""  # an endpoint attempt's: the runner's (a GPU attempt's is its manifest item's)


def share_identifier(tenant: str) -> str:
    """AWS Batch share ids are <= 255 alphanumeric characters (a trailing * is a prefix, so never produced)."""
    share = re.sub(r"[^A-Za-z0-9]", "", tenant)[:255]
    return share or "default"


def scheduling_priority(seconds_left: float) -> int:
    return int(max(0, min(9999, 9999 - max(0.0, seconds_left) // 600)))


def remaining_work_seconds(services: Services, batch_id: str) -> float:
    """Wall seconds the batch's unfinished shards still need on max_gpus GPUs, one cold start each."""
    settings, blobs = services.settings, services.adapters.blobs
    manifest = read_manifest(blobs, batch_id)
    done = {k.split("/")[-2] for k in blobs.list_keys(layout.all_results_prefix(batch_id))
            if k.endswith("/" + layout.DONE_NAME)}
    tokens, shards = 0, 0
    for item in manifest:
        if item.shard_id in done:
            continue
        est = item.est_tokens
        if est is None:  # a manifest written before Plan recorded the estimate: read the shard itself
            spec = read_shard(blobs, batch_id, item.shard_id)
            est = spec.est_tokens if spec else 0
        tokens += est
        shards += 1
    if not shards:
        return 0.0
    work = tokens / max(1e-9, settings.pipeline.shard_tokens_per_second)
    return wall_seconds(work, shards, min(shards, settings.pipeline.max_gpus),
                        settings.pipeline.shard_cold_start_seconds)


def _status_reason(error: dict[str, Any] | None) -> str:
    if not error:
        return ""
    name = str(error.get("Error") or "")
    if name.startswith("SageMaker."):  # CreateTrainingJob refused (ResourceLimitExceeded: the quota)
        return f"{name.removeprefix('SageMaker.')}: {str(error.get('Cause') or '')[:300]}"
    try:
        cause = json.loads(error.get("Cause") or "{}")
    except ValueError:
        return str(error.get("Cause") or name)
    if not isinstance(cause, dict):
        return name
    return (training_jobs.failure_reason(cause)
            or str(cause.get("StatusReason") or cause.get("statusReason") or name))


def decide(item: dict[str, Any], services: Services) -> CapacityDecision:
    settings, table = services.settings, services.adapters.table
    batch_id, shard_id = item["batch_id"], item["shard_id"]
    prev = item.get("capacity") or {}
    attempt = int(prev.get("attempt", 0)) + 1
    batch = table.get_record(BatchRecord, batch_id)
    available = settings.capacity.job_queues
    sagemaker = settings.capacity.sagemaker
    t = now()
    expires_at = batch.expires_at if batch is not None else None
    seconds_left = float(t if expires_at is None else expires_at) - t
    base: dict[str, Any] = {"attempt": attempt, "priority": scheduling_priority(seconds_left),
                            "share": share_identifier((batch.tenant if batch is not None else "") or "default")}
    fallback = bool(item.get("fallback"))
    gpu_fallback: Literal["", "batch", "sagemaker"] = item.get("gpu_fallback") or ""
    moved_to = moved_backend(batch)
    # A GPU backend of this shard: its own, or SageMaker once a `both` batch moved there.
    gpu: Backend = "sagemaker" if (item.get("backend") == "sagemaker" or gpu_fallback == "sagemaker"
                                   or (fallback and moved_to == "sagemaker")) else "batch"
    backend: Backend = prev.get("backend") or (
        "endpoint" if item.get("backend") == "endpoint" and not (moved_to and gpu_fallback) else gpu)
    margin = settings.capacity.margin_seconds

    def slack() -> float:
        return seconds_left - remaining_work_seconds(services, batch_id)

    def choose(capacity: Capacity, reason: str, *, failures: int = 0, wait: int = 0,
               on: Backend | None = None, quota_waits: int = 0) -> CapacityDecision:
        on = on or backend
        if on == "sagemaker":
            decision = _training_job(capacity, reason, failures=failures, wait=wait)
            return decision.model_copy(update={"quota_waits": quota_waits})
        if capacity not in available:  # a deployment with one kind only
            capacity = "on-demand" if "on-demand" in available else "spot"
        retry = ({"Attempts": 1} if capacity == "spot" else
                 {"Attempts": 3, "EvaluateOnExit": [{"Action": "RETRY", "OnStatusReason": "Host EC2*"},
                                                    {"Action": "EXIT", "OnReason": "*"}]})
        return CapacityDecision(action="run", capacity=capacity, queue=available.get(capacity, ""), failures=failures,
                                wait_seconds=wait, reason=reason, retry_strategy=retry, **base)

    def _training_job(capacity: Capacity, reason: str, *, failures: int, wait: int) -> CapacityDecision:
        if not (sagemaker.spot if capacity == "spot" else sagemaker.on_demand):
            capacity = "on-demand" if sagemaker.on_demand else "spot"
        # The model the shard serves (its spec's), not the batch's first line's: that may be a LoRA adapter or,
        # in a multi-model batch, another model.
        spec = read_shard(services.adapters.blobs, batch_id, shard_id)
        model = (spec.model if spec is not None else None) or (batch.model if batch is not None else None) or ""
        shard_work = _shard_work_seconds(services, item)
        return CapacityDecision(
            action="run", capacity=capacity, queue="", failures=failures, wait_seconds=wait, reason=reason,
            retry_strategy={}, backend="sagemaker",
            job_name=training_jobs.job_name(sagemaker.job_prefix, batch_id, shard_id, attempt),
            instance_type=sagemaker.instance_types.get(model, ""), managed_spot=capacity == "spot",
            stopping_condition=training_jobs.stopping_condition(
                spot=capacity == "spot", seconds_left=seconds_left,
                budget_seconds=shard_work + slack() - margin if capacity == "spot" else seconds_left,
                max_pending_seconds=sagemaker.max_pending_seconds),
            settings_key=layout.worker_settings_key(batch_id),
            output_uri=f"s3://{settings.deployment.bucket}/{layout.training_output_prefix(batch_id)}", **base)

    def move_to(on: Backend, reason: str) -> CapacityDecision:
        # The batch's remaining shards follow; on-demand if the batch already moved there.
        table.update_attributes(BatchRecord, batch_id, set_={"backend_moved": reason, "backend_moved_to": on})
        on_demand = bool(batch and batch.capacity_on_demand) or (
            prev.get("capacity") == "on-demand" and prev.get("backend") != "endpoint")  # a runner's is no GPU's
        return choose("on-demand" if on_demand or slack() < margin else "spot", reason, on=on)

    def on_endpoint(reason: str, *, failures: int = 0, wait: int = 0) -> CapacityDecision:
        capacity = settings.capacity
        return CapacityDecision(action="run", capacity="on-demand", queue=capacity.endpoint_job_queue,
                                job_definition=capacity.endpoint_job_definition, failures=failures,
                                wait_seconds=wait, reason=reason, retry_strategy={"Attempts": 1}, backend="endpoint",
                                **base)

    if batch is None or batch.status != "in_progress":
        decision = CapacityDecision(action="give_up", capacity=prev.get("capacity", "spot"), queue="", failures=0,
                                    wait_seconds=0, reason=f"batch is {batch.status if batch else 'missing'}",
                                    retry_strategy={}, backend=backend, **base)
    elif backend == "endpoint" and item.get("shard_error"):
        pace = read_pace(services.adapters.blobs, batch_id, shard_id)
        failures = int(prev.get("failures", 0)) + 1
        status_reason = _status_reason(item["shard_error"])
        if gpu_fallback and pace is not None and pace.move:
            decision = move_to(gpu, f"endpoint too slow: {pace.reason}"[:300])
        elif failures <= settings.capacity.retry_attempts:
            decision = on_endpoint(f"retry after: {status_reason[:200]}", failures=failures, wait=int(
                settings.capacity.retry_interval_seconds * settings.capacity.retry_backoff ** (failures - 1)))
        elif gpu_fallback:
            decision = move_to(gpu, f"endpoint runner failed {failures} times: {status_reason[:200]}")
        else:
            decision = on_endpoint(f"gave up after {failures} failed attempts: {status_reason[:200]}",
                                   failures=failures).model_copy(update={"action": "give_up"})
    elif backend == "endpoint":
        decision = on_endpoint("the model's endpoint")
    elif item.get("shard_error"):
        status_reason = _status_reason(item["shard_error"])
        placement = backend == "batch" and status_reason.startswith(training_jobs.BATCH_PLACEMENT_FAILURE)
        quota = backend == "sagemaker" and training_jobs.is_quota_refusal(
            str(item["shard_error"].get("Error") or ""), str(item["shard_error"].get("Cause") or ""))
        waits = int(prev.get("quota_waits", 0)) + 1
        quota_wait = int(min(QUOTA_WAIT_MAX_SECONDS, settings.capacity.retry_interval_seconds
                             * settings.capacity.retry_backoff ** (waits - 1)))
        if quota and seconds_left - quota_wait - _shard_work_seconds(services, item) > margin:
            decision = choose(prev.get("capacity", "spot"), f"waiting for quota: {status_reason[:200]}",
                              failures=int(prev.get("failures", 0)), wait=quota_wait, quota_waits=waits)
        elif placement and fallback and (prev.get("capacity") == "on-demand" or "on-demand" not in available
                                         or slack() < margin):
            # Batch could not place it, and there is no time (or no queue) left to try its other capacity.
            decision = move_to("sagemaker", f"batch could not place it: {status_reason[:200]}")
        elif prev.get("capacity") == "spot" and (
                status_reason.startswith(SPOT_SHORTAGE) if backend == "batch"
                else quota or status_reason.startswith(training_jobs.SPOT_SHORTAGE)):
            reason = f"spot attempt ended: {status_reason[:200]}"
            # The batch's remaining shards follow.
            table.update_attributes(BatchRecord, batch_id, set_={"capacity_on_demand": reason})
            decision = choose("on-demand", reason)
        else:
            failures = int(prev.get("failures", 0)) + 1
            if failures > settings.capacity.retry_attempts:
                decision = choose(prev.get("capacity", "spot"), f"gave up after {failures} failed attempts: "
                                  f"{status_reason[:200]}", failures=failures)
                decision = decision.model_copy(update={"action": "give_up"})
            else:
                wait = int(settings.capacity.retry_interval_seconds
                           * settings.capacity.retry_backoff ** (failures - 1))
                decision = choose(prev.get("capacity", "spot"), f"retry after: {status_reason[:200]}",
                                  failures=failures, wait=wait)
    elif batch.capacity_on_demand:
        decision = choose("on-demand", f"batch moved to on-demand: {batch.capacity_on_demand}")
    else:
        current = slack()
        if current < margin:
            reason = f"slack {current:.0f} s < margin {margin:.0f} s"
            table.update_attributes(BatchRecord, batch_id, set_={"capacity_on_demand": reason})
            decision = choose("on-demand", reason)
        else:
            decision = choose("spot", f"slack {current:.0f} s >= margin {margin:.0f} s")
    services.adapters.blobs.put_bytes(
        layout.capacity_key(layout.results_prefix(batch_id, shard_id), attempt),
        json.dumps({"at": t, **decision.model_dump(exclude={"retry_strategy", "stopping_condition"})}).encode(),
        content_type="application/json")
    return decision


def moved_backend(batch: BatchRecord | None) -> str | None:
    """Where the batch's remaining shards moved, if they did (a move recorded before `backend_moved_to` existed
    was to SageMaker)."""
    if batch is None or not batch.backend_moved:
        return None
    return batch.backend_moved_to or "sagemaker"


def _shard_work_seconds(services: Services, item: dict[str, Any]) -> float:
    """One shard's estimated GPU time, cold start included (the Spot wait a SageMaker job may add to it)."""
    pipeline = services.settings.pipeline
    return float(item.get("est_tokens") or 0) / max(1e-9, pipeline.shard_tokens_per_second) + \
        pipeline.shard_cold_start_seconds


def collect_decisions(services: Services, batch_id: str, limit: int = 50,
                      listed: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """Every shard's decisions, in order, for the batch's extension (at most `limit` entries). `listed`: the
    keys under the batch's results prefix, if listed already (else listed here)."""
    blobs = services.adapters.blobs
    keys = sorted(k for k in (blobs.list_keys(layout.all_results_prefix(batch_id)) if listed is None else listed)
                  if k.rsplit("/", 1)[-1].startswith(layout.CAPACITY_PREFIX))
    out: list[dict[str, Any]] = []
    for key in keys[:limit]:
        rec = json.loads(blobs.get_bytes(key) or b"{}")
        out.append({"shard_id": key.split("/")[-2], **{k: rec.get(k) for k in (
            "attempt", "action", "backend", "capacity", "priority", "share", "reason", "at")}})
    return out
