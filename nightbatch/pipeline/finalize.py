"""Finalize: merge shard results into the output and error files, then make the terminal transition.

Idempotent: file ids derive from the batch id, a second run writes the same bytes (shards, checkpoints and
lines are read in key order; the first result per custom_id wins) and finds the batch already terminal.
Successful lines are not uploaded again: the output file is composed from ranges of the checkpoint objects
(nightbatch/pipeline/compose.py); S3 copies every range of at least 5 MiB server-side.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from nightbatch import layout, lifecycle
from nightbatch.accounting import collect_shard_times, cost_summary
from nightbatch.clock import now
from nightbatch.errors import BatchItemTooLargeError, StorageConflictError
from nightbatch.ids import custom_id_digest, derived_id
from nightbatch.jsonl import split_lines
from nightbatch.metrics import emit
from nightbatch.phases import summarize as summarize_phases
from nightbatch.pipeline.capacity import collect_decisions
from nightbatch.pipeline.compose import PartComposer
from nightbatch.pipeline.models import BatchTaskInput, FinalizeOutput
from nightbatch.pipeline.per_model import per_model_report
from nightbatch.pipeline.results import (
    MAX_RESULT_LINE,
    Tally,
    summarize_result_line,
    tally_plain_lines,
    unrun_line,
)
from nightbatch.pipeline.segments import parse_segment_line
from nightbatch.services import Services
from nightbatch.storage import BlobStore, LineWriter
from nightbatch.storage.parts import PartStore
from nightbatch.storage.records import BatchRecord
from nightbatch.wire import TERMINAL_STATUSES

log = logging.getLogger("nightbatch.finalize")
UNRUN_CODE = {"cancelled": "batch_cancelled", "expired": "batch_expired", "completed": "shard_failed"}
READ_WHOLE_BYTES = 64 * 1024 * 1024  # checkpoint objects up to this size are read in one GET, larger streamed
PIECE_BYTES = 4 * 1024 * 1024  # lines counted in bulk at a time (bounds the decoded lines held at once)


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
            batch = lifecycle.transition(table, inp.batch_id, "finalizing", extra={"finalize_target": target})
        except StorageConflictError:
            return finalize_batch(inp, services)  # cancelled meanwhile: decide again
    writers = _write_files(services, batch, UNRUN_CODE[target])
    out_id, err_id, tally = writers
    usage = tally.usage()
    times = collect_shard_times(services.adapters.blobs, [layout.all_results_prefix(inp.batch_id)])
    ext = dict(batch.ext or {})
    ext["cost"] = cost_summary(services.settings, times, usage["total_tokens"], usage["output_tokens"])
    if times.phases:
        ext["phases"] = summarize_phases(times.phases)
    if "models" in ext:  # Validate found more than one model (nightbatch/pipeline/per_model.py)
        ext["models"] = per_model_report(services.adapters.blobs, services.settings, inp.batch_id,
                                         batch.model or "")
    decisions = collect_decisions(services, inp.batch_id)
    if decisions:  # where each shard's jobs ran, and why (nightbatch/pipeline/capacity.py)
        ext["capacity"] = decisions
    fields: dict[str, Any] = {
        "request_counts": {"total": tally.completed + tally.failed, "completed": tally.completed,
                           "failed": tally.failed},
        "usage": usage, "output_file_id": out_id, "error_file_id": err_id, "ext": ext,
    }
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


def _shards(blobs: BlobStore, batch_id: str) -> Iterator[tuple[str | None, list[str], int]]:
    """(shard_id, segment keys, lines) per planned shard; shard_id None for segments no shard took."""
    items = layout.read_manifest(blobs, batch_id)
    if items:
        for item in items:
            shard = layout.read_shard(blobs, batch_id, item.shard_id)
            if shard is not None:
                yield shard.shard_id, shard.segments, shard.lines
        return
    # Never planned, or planned after a cancel/expiry (empty manifest): every validated segment is unrun.
    segs = layout.read_segment_index(blobs, batch_id)
    if segs:
        yield None, [s.key for s in segs], sum(s.lines for s in segs)


def _write_files(services: Services, batch: BatchRecord, unrun_code: str) -> tuple[
        str | None, str | None, Tally]:
    blobs = services.adapters.blobs
    batch_id = batch.pk
    tally = Tally()
    out = PartComposer(blobs, layout.output_key(batch_id))
    err = blobs.writer(layout.error_key(batch_id))
    try:
        for shard_id, segments, lines in _shards(blobs, batch_id):
            seen: set[int] = set()
            if shard_id is not None:
                _merge_results(blobs, batch_id, shard_id, seen, out, err, tally)
            if len(seen) < lines:
                for key in segments:
                    for raw in split_lines(blobs.iter_chunks_ahead(key), max_bytes=MAX_RESULT_LINE):
                        if not raw.data:
                            continue
                        custom_id = parse_segment_line(raw.data).custom_id
                        if (d := custom_id_digest(custom_id)) not in seen:
                            seen.add(d)
                            err.write(unrun_line(batch_id, custom_id, unrun_code))
                            tally.failed += 1
        out_bytes = out.close()
        err_bytes = err.close()
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


def _merge_results(blobs: BlobStore, batch_id: str, shard_id: str, seen: set[int], out: PartComposer,
                   err: LineWriter, tally: Tally) -> None:
    prefix = layout.results_prefix(batch_id, shard_id)
    sizes = PartStore(blobs).sizes(prefix)
    for key in sorted(k for k in sizes if layout.is_checkpoint(prefix, k)):
        if sizes[key] > READ_WHOLE_BYTES:
            _merge_streamed(blobs, batch_id, key, seen, out, err, tally)
        else:
            _merge_object(batch_id, key, blobs.get_bytes(key) or b"", seen, out, err, tally)


def _too_long(batch_id: str, key: str, number: int, size: int) -> None:
    # Workers never write one (gpu_worker.results); its request ends as shard_failed, so say why.
    log.error("result line %d of %s is %d bytes, over %d: its request is reported unrun", number, key, size,
              MAX_RESULT_LINE, extra={"batch_id": batch_id})


def _merge_object(batch_id: str, key: str, data: bytes, seen: set[int], out: PartComposer, err: LineWriter,
                  tally: Tally) -> None:
    """Runs of successful lines that need no rewrite go to the output as ranges of `key` (copied by S3 when
    big enough); everything else is written line by line. The object is read in pieces of whole lines; a
    piece whose lines are all plain is counted in bulk (results.tally_plain_lines), the others line by line."""
    view = memoryview(data)
    run = -1  # start of the current run of lines kept as they are
    size = len(data)
    pos = number = 0
    while pos < size:
        cut = data.find(b"\n", min(pos + PIECE_BYTES, size) - 1)
        end = size if cut < 0 else cut + 1  # the piece [pos, end) ends after a newline, or at the end
        plain = tally_plain_lines(data[pos:end], seen, tally)
        if plain:
            run = pos if run < 0 else run
            number += plain
            pos = end
            continue
        while pos < end:
            nl = data.find(b"\n", pos, end)
            nxt = end + 1 if nl < 0 else nl + 1  # past the end: the last line has no newline
            line = data[pos:nxt - 1]
            number += 1
            keep = False
            rewrite: bytes | None = None
            if len(line) > MAX_RESULT_LINE:
                _too_long(batch_id, key, number, len(line))
            elif line:
                clean = line[:-1] if line[-1] == 13 else line  # CRLF: the CR is dropped, as split_lines does
                summary = summarize_result_line(clean)
                d = custom_id_digest(summary.custom_id)
                if d not in seen:  # else a zombie attempt's duplicate: the first result wins
                    seen.add(d)
                    if summary.ok:
                        tally.add_success(summary.usage)
                        keep = clean is line and nxt <= size
                        rewrite = None if keep else clean + b"\n"
                    else:
                        err.write(clean + b"\n")
                        tally.failed += 1
            if keep:
                run = pos if run < 0 else run
            elif run >= 0:
                out.add_range(key, run, view[run:pos])
                run = -1
            if rewrite is not None:
                out.add_bytes(rewrite)
            pos = nxt
    if run >= 0:
        out.add_range(key, run, view[run:min(pos, size)])


def _merge_streamed(blobs: BlobStore, batch_id: str, key: str, seen: set[int], out: PartComposer,
                    err: LineWriter, tally: Tally) -> None:
    for raw in split_lines(blobs.iter_chunks_ahead(key), max_bytes=MAX_RESULT_LINE):
        if raw.data is None:
            _too_long(batch_id, key, raw.number, raw.size)
            continue
        if not raw.data:
            continue
        summary = summarize_result_line(raw.data)
        d = custom_id_digest(summary.custom_id)
        if d in seen:
            continue
        seen.add(d)
        if summary.ok:
            out.add_bytes(raw.data + b"\n")
            tally.add_success(summary.usage)
        else:
            err.write(raw.data + b"\n")
            tally.failed += 1
