"""Finalize: merge shard results into the output and error files (and a Message Batch's results in Anthropic's
shape: nightbatch/messages/results.py), then make the terminal transition.

Idempotent: file ids derive from the batch id, a second run writes the same bytes (shards, checkpoints and
lines are read in key order; the first result per custom_id wins: nightbatch.results.merge) and finds the
batch already terminal. Successful lines are not uploaded again: the output file is composed from ranges of
the checkpoint objects (nightbatch/results/compose.py); S3 copies every range of at least 5 MiB server-side.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from nightbatch import layout
from nightbatch.aws.botoerrors import client_error
from nightbatch.aws.failures import AWS_ERRORS
from nightbatch.aws.records import BatchRecord
from nightbatch.batches import lifecycle
from nightbatch.batches.cost import collect_shard_times, cost_summary, training_job_billing
from nightbatch.clock import now
from nightbatch.errors import BatchItemTooLargeError, StorageConflictError
from nightbatch.files.user_buckets import copy_outputs
from nightbatch.ids import custom_id_digest, derived_id
from nightbatch.messages.objects import WIRE as MESSAGES_WIRE
from nightbatch.messages.results import write_results
from nightbatch.metrics import emit
from nightbatch.phases import summarize as summarize_phases
from nightbatch.pipeline.capacity import collect_decisions
from nightbatch.pipeline.payloads import BatchTaskInput, FinalizeOutput
from nightbatch.results.compose import PartComposer
from nightbatch.results.input_order import InputOrder
from nightbatch.results.lines import Tally, unrun_line
from nightbatch.results.merge import merge_shard
from nightbatch.results.per_model import per_model_report
from nightbatch.results.precedence import Listing, planned_shards, results_listing
from nightbatch.shards.lines import shard_ids
from nightbatch.tenancy.scope import Scope, ScopeError
from nightbatch.wire import TERMINAL_STATUSES
from nightbatch.wiring import Services

log = logging.getLogger("nightbatch.finalize")
# Finalize runs that may raise on a batch's data (the workflow's 1 + 2 retries) before it is failed.
FINALIZE_ATTEMPTS = 3
_OPEN = ("validating", "in_progress", "cancelling", "finalizing")
UNRUN_CODE = {"cancelled": "batch_cancelled", "expired": "batch_expired", "completed": "shard_failed"}


def decide_target(batch: BatchRecord) -> str:
    status = batch.status
    if status == "cancelling":
        return "cancelled"
    if status == "finalizing":
        return batch.finalize_target or "completed"
    expired = batch.expires_at is not None and now() >= batch.expires_at
    if status == "validating":
        return "expired" if expired else "failed"
    return "expired" if expired else "completed"


def finalize_batch(inp: BatchTaskInput, services: Services) -> FinalizeOutput:
    try:
        return _finalize(inp, services)
    except BatchItemTooLargeError:
        # lifecycle failed the batch for good (its item outgrew DynamoDB's limit); nothing is left to retry.
        log.error("batch item too large; failed", extra={"batch_id": inp.batch_id})
        return FinalizeOutput(batch_id=inp.batch_id, status="failed")
    except AWS_ERRORS:
        raise  # AWS or the network: retried (the workflow's retries, then the sweeper), never counted
    except Exception as exc:
        return _failed_attempt(services, inp.batch_id, exc)


def _failed_attempt(services: Services, batch_id: str, exc: Exception) -> FinalizeOutput:
    """A Finalize that raised on the batch's data rather than on AWS: raised again (and counted) until the
    FINALIZE_ATTEMPTS-th time, which fails the batch saying why and gives back the tenant's slot, so one batch
    Finalize cannot finish never stays open for good."""
    table = services.adapters.table
    batch = table.get_record(BatchRecord, batch_id)
    if batch is None or batch.status in TERMINAL_STATUSES:
        raise exc
    ext = dict(batch.ext or {})
    ext["finalize_failures"] = failures = int(ext.get("finalize_failures") or 0) + 1
    log.exception("finalize failed (%d of %d)", failures, FINALIZE_ATTEMPTS, extra={"batch_id": batch_id})
    if failures < FINALIZE_ATTEMPTS:
        with contextlib.suppress(StorageConflictError):
            table.update_attributes(BatchRecord, batch_id, set_={"ext": ext}, expect_in={"status": (batch.status,)})
        raise exc
    message = (f"The batch's results could not be assembled ({type(exc).__name__}: {str(exc)[:300]}); its "
               "output and error files were not written. Please report this with the batch id.")
    try:
        lifecycle.transition(table, batch_id, "failed", from_=_OPEN, extra={"ext": ext, "errors": {
            "object": "list", "data": [{"code": "finalize_failed", "line": None, "param": None,
                                        "message": message}]}})
    except StorageConflictError:
        return finalize_batch(BatchTaskInput(batch_id=batch_id), services)
    emit(services.settings, {"BatchesFinished": 1}, dimensions={"Status": "failed"})
    return FinalizeOutput(batch_id=batch_id, status="failed")


def _finalize(inp: BatchTaskInput, services: Services) -> FinalizeOutput:
    table = services.adapters.table
    batch = table.get_record(BatchRecord, inp.batch_id)
    if batch is None:
        return FinalizeOutput(batch_id=inp.batch_id, status="missing")
    if batch.status in TERMINAL_STATUSES:
        return FinalizeOutput(batch_id=inp.batch_id, status=batch.status)
    target = decide_target(batch)
    if target == "failed":
        return _fail_unvalidated(services, batch)
    if target != "cancelled" and batch.status != "finalizing":
        try:
            batch = lifecycle.transition(table, inp.batch_id, "finalizing", extra={"finalize_target": target},
                                         events=services.batches.events)
        except StorageConflictError:
            return finalize_batch(inp, services)  # cancelled meanwhile: decide again
    listed = results_listing(services.adapters.blobs, inp.batch_id)  # one listing for the merge, times, decisions
    keys = [k for shard in listed.values() for k in shard]
    writers = _write_files(services, batch, UNRUN_CODE[target], listed)
    out_id, err_id, tally = writers
    usage = tally.usage()
    times = collect_shard_times(services.adapters.blobs, [layout.all_results_prefix(inp.batch_id)], keys)
    ext = dict(batch.ext or {})
    if ext.get("output_uri"):
        _copy_to_user(services, batch, ext, {"output": out_id, "error": err_id})
    if batch.wire == MESSAGES_WIRE:  # Anthropic's result lines, written once for the API to hand out
        write_results(services, batch.model_copy(update={"status": target, "output_file_id": out_id,
                                                         "error_file_id": err_id}))
    billing = training_job_billing(services.adapters, times)
    ext["cost"] = cost_summary(services.settings, times, usage["total_tokens"], usage["output_tokens"],
                               billing=billing)
    if times.phases:
        ext["phases"] = summarize_phases(times.phases)
    if "models" in ext:  # Validate found more than one model (nightbatch/results/per_model.py)
        ext["models"] = per_model_report(services.adapters.blobs, services.settings, inp.batch_id,
                                         batch.model or "", billing=billing)
    decisions = collect_decisions(services, inp.batch_id, listed=keys)
    if decisions:  # where each shard's jobs ran, and why (nightbatch/pipeline/capacity.py)
        ext["capacity"] = decisions
    ended = tally.completed + tally.failed
    # Validate's total (est_tokens set: Validate counted), never recounted: every line it accepted ends once.
    total = int(batch.request_counts.get("total", ended)) if batch.est_tokens is not None else ended
    if total != ended:
        log.error("%d lines ended of %d accepted", ended, total, extra={"batch_id": inp.batch_id})
    fields: dict[str, Any] = {
        "request_counts": {"total": total, "completed": tally.completed, "failed": tally.failed},
        "usage": usage, "output_file_id": out_id, "error_file_id": err_id, "ext": ext,
    }
    if tally.unrun:
        fields["unrun_counts"] = tally.unrun
    if target == "expired":
        fields["finalizing_at"] = batch.finalizing_at or now()
    try:
        lifecycle.transition(table, inp.batch_id, target, extra=fields,
                             from_=("cancelling",) if target == "cancelled" else ("finalizing",))
    except StorageConflictError:
        fresh = table.get_record(BatchRecord, inp.batch_id)
        return FinalizeOutput(batch_id=inp.batch_id, status=fresh.status if fresh else "missing")
    emit(services.settings, {"BatchesFinished": 1}, dimensions={"Status": target})
    log.info("finalized", extra={"batch_id": inp.batch_id, "status": target, "completed": tally.completed,
                                 "failed": tally.failed, "cost": ext["cost"]})
    return FinalizeOutput(batch_id=inp.batch_id, status=target)


def _copy_to_user(services: Services, batch: BatchRecord, ext: dict[str, Any], ids: dict[str, str | None]) -> None:
    """The written files copied server-side under the batch's `output_uri` (files/user_buckets.py). A copy the
    user's bucket refuses is said on the batch object (`output_copy_error`) rather than retried for good: the
    files are still served through the Files API."""
    keys = {"output": layout.output_key(batch.pk), "error": layout.error_key(batch.pk)}
    try:
        copy_outputs(services.adapters.blobs, Scope.of(services.settings, batch.tenant), ext["output_uri"],
                     {k: keys[k] for k, v in ids.items() if v})
    except ScopeError as e:  # the allow-list changed since create: the tenant may no longer write there
        log.warning("output copy to %s not allowed now", ext["output_uri"], extra={"batch_id": batch.pk})
        ext["output_copy_error"] = e.message
        return
    except client_error() as e:
        if not 400 <= int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 500) < 500:
            raise  # S3 or the network: retried like any other
        code = e.response.get("Error", {}).get("Code", "error")
        log.warning("output copy to %s refused: %s", ext["output_uri"], code, extra={"batch_id": batch.pk})
        ext["output_copy_error"] = f"S3 refused the copy to {ext['output_uri']} ({code})."


def _fail_unvalidated(services: Services, batch: BatchRecord) -> FinalizeOutput:
    """Validate never finished (it crashed and its retries ran out): fail the batch rather than leave it."""
    try:
        lifecycle.transition(services.adapters.table, batch.pk, "failed", extra={"errors": {
            "object": "list", "data": [{"code": "validation_error", "line": None, "param": None,
                                        "message": "The input could not be validated; please retry."}]}})
    except StorageConflictError:
        return finalize_batch(BatchTaskInput(batch_id=batch.pk), services)
    emit(services.settings, {"BatchesFinished": 1}, dimensions={"Status": "failed"})
    return FinalizeOutput(batch_id=batch.pk, status="failed")


def _write_files(services: Services, batch: BatchRecord, unrun_code: str, listed: dict[str, Listing]) -> tuple[
        str | None, str | None, Tally]:
    blobs = services.adapters.blobs
    batch_id = batch.pk
    tally = Tally()
    out = PartComposer(blobs, layout.output_key(batch_id))
    err = blobs.writer(layout.error_key(batch_id))
    # `nightbatch.output_order: "input"`: the successes are merged by input line once every shard is read.
    by_input = InputOrder(blobs, batch_id) if (batch.ext or {}).get("output_order") == "input" else None
    try:
        for shard in planned_shards(blobs, batch_id):
            seen: set[int] = set()
            if shard.shard_id is not None:
                merge_shard(blobs, batch_id, shard.shard_id, seen, out, err, tally, listed.get(shard.shard_id, {}),
                            by_input)
                if by_input is not None:
                    by_input.end_shard(shard)
            if len(seen) < shard.lines and (spec := shard.spec) is not None:
                # Named by the line indexes: no input is read, so a changed or deleted input cannot stop this.
                for _, custom_id in shard_ids(blobs, spec):
                    if (d := custom_id_digest(custom_id)) not in seen:
                        seen.add(d)
                        err.write(unrun_line(batch_id, custom_id, unrun_code))
                        tally.failed += 1
                        tally.unrun[unrun_code] = tally.unrun.get(unrun_code, 0) + 1
        if by_input is not None:
            by_input.write(out)
        out_bytes = out.close()
        err_bytes = err.close(keep_empty=False)  # none: no PUT (`register` deletes one an earlier run left)
    except BaseException:
        out.abort()
        err.abort()
        raise
    tenant = batch.tenant
    ttl = batch.output_expires_after_seconds
    created = now()

    def register(key: str, size: int, kind: str) -> str | None:
        if size == 0:
            blobs.delete(key)
            return None
        file_id = derived_id("file-", batch_id, kind)
        services.files.register(tenant, file_id=file_id, key=key, size=size,
                                filename=f"{batch_id}_{kind}.jsonl", purpose="batch_output",
                                expires_after_seconds=ttl, extra={"batch_id": batch_id}, created_at=created)
        return file_id

    return register(layout.output_key(batch_id), out_bytes, "output"), register(
        layout.error_key(batch_id), err_bytes, "error"), tally
