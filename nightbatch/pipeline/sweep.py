"""The sweeper (every few minutes in AWS): re-drives batches whose workflow never started, finalizes batches
whose workflow died past their window, cancels queued Batch jobs and stops running SageMaker training jobs of
cancelled, expired or ended batches, and reports the gauges the alarms watch."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from nightbatch.aws.batch_jobs import ACTIVE, UNSTARTED, BatchJobs
from nightbatch.aws.records import BatchRecord, EventRecord
from nightbatch.aws.sagemaker_jobs import TrainingJobStops
from nightbatch.clock import now
from nightbatch.metrics import emit
from nightbatch.pipeline.finalize import finalize_batch
from nightbatch.pipeline.payloads import BatchTaskInput
from nightbatch.pipeline.training_jobs import batch_of_job
from nightbatch.settings.base import comma_list
from nightbatch.wire import TERMINAL_STATUSES
from nightbatch.wiring import Services

log = logging.getLogger("nightbatch.sweep")
STALE_SECONDS = 300
OPEN_STATUSES = ("validating", "in_progress", "cancelling", "finalizing")
# The execution's own timeout is the window plus a finalize margin; past this the workflow is gone.
EXPIRY_GRACE_SECONDS = 1800
# Notify retries for ~15 minutes (infra/orchestration.py); the sweeper takes over after that.
NOTIFY_GRACE_SECONDS = 1200
# Time for the training jobs per run (a listing page per 100 jobs, a read per batch, a stop per unwanted job): the
# jobs not reached wait for the next run, which starts again from the oldest.
TRAINING_JOBS_SECONDS = 120.0


def sweep(services: Services, *, stale_seconds: int = STALE_SECONDS,
          expiry_grace_seconds: int = EXPIRY_GRACE_SECONDS, notify: Callable[[str], object] | None = None,
          notify_grace_seconds: int = NOTIFY_GRACE_SECONDS,
          training_jobs_seconds: float = TRAINING_JOBS_SECONDS) -> dict[str, Any]:
    table, settings = services.adapters.table, services.settings
    t = now()
    redriven: list[str] = []
    finalized: list[str] = []
    open_counts: dict[str, int] = {}
    oldest: dict[str, int] = {}
    skipped: list[str] = []
    for status in OPEN_STATUSES:
        for batch_id in table.open_ids(status):
            # One batch that cannot be handled (a corrupt or oversized item, a throttled call) is logged and
            # skipped: it must not stop the sweep re-driving and finalizing every other batch.
            try:
                batch = table.get_record(BatchRecord, batch_id)
                if batch is None or batch.status != status:
                    continue
                open_counts[status] = open_counts.get(status, 0) + 1
                age = t - int(getattr(batch, f"{status}_at", None) or batch.created_at)
                oldest[status] = max(oldest.get(status, 0), age)
                if t > _expires_at(batch) + expiry_grace_seconds:
                    # Finalize is idempotent: safe even if the workflow is in fact still finishing.
                    finalized.append(finalize_batch(BatchTaskInput(batch_id=batch.pk), services).batch_id)
                elif status == "validating" and batch.created_at <= t - stale_seconds:
                    # Executions are named after the batch: starting one that exists is a no-op.
                    services.batches.workflow.start(batch.pk)
                    redriven.append(batch.pk)
            except Exception:
                log.exception("sweep: batch %s skipped", batch_id, extra={"batch_id": batch_id})
                skipped.append(batch_id)
    cancelled_jobs = _sweep_jobs(services, t) if settings.pipeline.job_queue else []
    try:
        stopped_training_jobs = (_sweep_training_jobs(services, t, training_jobs_seconds)
                                 if settings.capacity.sagemaker_json else [])
    except Exception:
        log.exception("sweep: listing the training jobs failed")
        stopped_training_jobs = []
    try:
        expired_uploads = services.uploads.sweep_expired()
    except Exception:
        log.exception("sweep: expiring uploads failed")
        expired_uploads = []
    try:
        released_files = services.files.release_held()
    except Exception:
        log.exception("sweep: releasing the bytes of deleted files failed")
        released_files = []
    if skipped:
        emit(settings, {"SweepBatchesSkipped": len(skipped)})
    if open_counts:
        for status, n in open_counts.items():
            emit(settings, {"BatchesOpen": n}, dimensions={"Status": status})
        for status in ("validating", "finalizing"):
            if status in oldest:
                emit(settings, {"OldestBatchAgeSeconds": oldest[status]}, units={"OldestBatchAgeSeconds": "Seconds"},
                     dimensions={"Status": status})
    renotified = _renotify(services, t, notify, notify_grace_seconds) if notify is not None else []
    return {"redriven": redriven, "finalized": finalized, "renotified": renotified,
            "cancelled_jobs": cancelled_jobs, "stopped_training_jobs": stopped_training_jobs, "skipped": skipped,
            "expired_uploads": expired_uploads, "released_files": released_files}


def _renotify(services: Services, t: int, notify: Callable[[str], object], grace: int) -> list[str]:
    """Events whose channels are still pending once Notify's own retries are over: Notify again (idempotent:
    it sends only what is missing)."""
    table = services.adapters.table
    out: list[str] = []
    for event_id in table.open_ids(EventRecord.PENDING):
        try:
            event = table.get_record(EventRecord, event_id)
            if event is None or not event.pending or event.created_at > t - grace:
                continue
            notify(event.batch_id)
            out.append(event.batch_id)
        except Exception:
            log.exception("sweep: re-notifying %s failed", event_id)
    return out


def _sweep_jobs(services: Services, t: int) -> list[str]:
    settings, table = services.settings, services.adapters.table
    every = [BatchJobs(client=services.adapters.client("batch"), queue=q)
             for q in comma_list(settings.pipeline.job_queue)]  # the Spot and on-demand queues
    cancelled: list[str] = []
    counts: dict[str, int] = {}
    oldest_runnable = 0
    for status, jobs in ((s, j) for s in ACTIVE for j in every):
        for job in jobs.jobs(status):
            counts[status] = counts.get(status, 0) + 1
            if status == "RUNNABLE":
                oldest_runnable = max(oldest_runnable, t - int(job.get("createdAt", t * 1000)) // 1000)
            if status not in UNSTARTED:
                continue
            try:
                # Job names are "<batch_id>-<shard_id>" (infra/orchestration.py).
                batch = table.get_record(BatchRecord, str(job.get("jobName", "")).rsplit("-", 1)[0])
                if batch is not None and _unwanted(batch, t):
                    jobs.cancel(job["jobId"], "nightbatch: batch cancelled or expired")
                    cancelled.append(job["jobId"])
            except Exception:
                log.exception("sweep: job %s skipped", job.get("jobId"))
    if counts:
        for status, n in counts.items():
            emit(settings, {"QueueJobs": n}, dimensions={"JobStatus": status})
        gauges: dict[str, float] = {"OldestRunnableJobAgeSeconds": oldest_runnable,
                                    "GpuInstancesRunning": counts.get("RUNNING", 0)}
        emit(settings, gauges, units={"OldestRunnableJobAgeSeconds": "Seconds"})
    return cancelled


def _sweep_training_jobs(services: Services, t: int, seconds: float) -> list[str]:
    """Stops the InProgress training jobs (of this deployment: found by its job-name prefix) whose batch is
    cancelling, ended or past its window: every such job, page after page, oldest first, for at most `seconds`.
    A job still waiting for an instance never sees the batch's cancel flag itself; a running one flushes on SIGTERM
    (StopTrainingJob gives it 120 s), and its shard's lines are written by Finalize as the batch's. One job that
    cannot be handled is logged and skipped. (A job the listing skips because the stops before it moved its pages
    is met by the next run.)"""
    table = services.adapters.table
    jobs = TrainingJobStops(client=services.adapters.client("sagemaker"),
                            prefix=services.settings.capacity.sagemaker.job_prefix)
    deadline = time.monotonic() + seconds
    batches: dict[str, BatchRecord | None] = {}
    stopped: list[str] = []
    for seen, name in enumerate(jobs.in_progress()):
        if time.monotonic() > deadline:
            log.warning("sweep: out of time after %d training jobs; the others wait for the next run", seen)
            break
        try:
            batch_id = batch_of_job(name, jobs.prefix)
            if batch_id is None:
                continue
            if batch_id not in batches:
                batches[batch_id] = table.get_record(BatchRecord, batch_id)
            batch = batches[batch_id]
            if batch is not None and _unwanted(batch, t):
                jobs.stop(name)
                stopped.append(name)
        except Exception:
            log.exception("sweep: training job %s skipped", name)
    return stopped


def _unwanted(batch: BatchRecord, t: int) -> bool:
    """The batch wants no more GPU work: cancelled or cancelling, ended, or past its window."""
    return batch.status in TERMINAL_STATUSES or batch.status == "cancelling" or t >= _expires_at(batch)


def _expires_at(batch: BatchRecord) -> int:
    if batch.expires_at is None:  # every batch is made with its window's end (nightbatch/batches/service.py)
        raise ValueError(f"batch {batch.pk} has no expires_at")
    return batch.expires_at
