"""Validate: stream the input once, check every line, and index the valid lines as segments for Plan (byte
ranges of the input, nightbatch/shards/packs.py: the lines are not copied)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Any

from nightbatch import layout
from nightbatch.aws import BlobStore
from nightbatch.aws.records import BatchRecord, FileRecord
from nightbatch.batches import lifecycle
from nightbatch.clock import now
from nightbatch.errors import StorageConflictError
from nightbatch.files.inputs import InputReader, InputUnavailable, keep
from nightbatch.files.sources import InputSource
from nightbatch.jsonl import LineBlock, RawLine, block_lines
from nightbatch.metrics import emit
from nightbatch.pipeline.payloads import BatchTaskInput, ValidateOutput
from nightbatch.pipeline.prefixes import PrefixGroups
from nightbatch.results.per_model import model_counts
from nightbatch.shards.packs import IndexWriter
from nightbatch.tenancy.limits import check_queue_limits
from nightbatch.tenancy.scope import tenant_tags
from nightbatch.validation.invalid import LineInvalid
from nightbatch.validation.lines import MAX_ERRORS_BYTES, Validator, line_error
from nightbatch.wire import BatchError
from nightbatch.wiring import Services

log = logging.getLogger("nightbatch.validate")
KEEP_MARGIN_SECONDS = 86400  # past the batch's expiry: the sweeper's grace, Finalize, retries


def validate_batch(inp: BatchTaskInput, services: Services) -> ValidateOutput:
    settings, table, blobs = services.settings, services.adapters.table, services.adapters.blobs
    batch = table.get_record(BatchRecord, inp.batch_id)
    if batch is None:
        return ValidateOutput(batch_id=inp.batch_id, valid=False)
    cancelled_early = batch.status == "cancelling" and batch.est_tokens is None
    if batch.status != "validating" and not cancelled_early:
        # A re-run (retry, re-drive): the first run already decided.
        return ValidateOutput(batch_id=inp.batch_id, valid=batch.status != "failed")
    # Cancelled before validation: still read the input, so that Finalize can write one `batch_cancelled`
    # line per request (exactly one result line per input line, in every case).
    file_item = table.get_owned(FileRecord, batch.tenant, batch.input_file_id)
    if file_item is None:
        return _fail(services, batch, [BatchError(
            code="invalid_request", param="file_id", line=None,
            message=f"Cannot find file {batch.input_file_id}, or it was deleted before the batch ran.")])
    if file_item.bytes > settings.validation.max_input_bytes:
        return _fail(services, batch, [BatchError(
            code="file_too_large", param=None, line=None,
            message=f"The input file is {file_item.bytes} bytes, over the limit of "
                    f"{settings.validation.max_input_bytes} bytes per batch.")])

    prefix_groups = PrefixGroups(groups=settings.pipeline.plan_prefix_groups,
                                 min_chars=settings.pipeline.plan_prefix_chars)
    # Lines prefix grouping reads take the general path: it builds the body their group is read from.
    validator = Validator(settings=settings, endpoint=batch.endpoint, fast_max_bytes=prefix_groups.min_line_bytes,
                          file_images=services.files.images(batch.tenant, tag=True))
    writer = IndexWriter(blobs, inp.batch_id, settings.pipeline.segment_max_lines,
                           settings.pipeline.segment_max_bytes)
    errors: list[BatchError] = []
    errors_bytes = 0
    count = 0
    # Read once, not per line: the loop runs a million times for a big batch.
    max_requests = settings.validation.max_requests_per_batch
    add = writer.add
    grouped_from = prefix_groups.min_line_bytes
    # The input at the version accepted (nightbatch/files/inputs.py), each object of an in-place input a JSONL
    # document of its own: no run of the index crosses from one into the next.
    reader: InputReader | None = None
    plain = validator.plain
    max_bytes = settings.validation.max_line_bytes
    stop = False
    try:
        reader = services.files.reader(file_item)
        for item in _first_line_apart(reader.blocks(max_bytes=max_bytes, read_ahead=True, between=writer.break_runs)):
            if not isinstance(item, LineBlock):
                lines: Iterable[RawLine] = (item,)
            else:
                # A block of valid plain lines (the common case) is checked and indexed without a step per line.
                if not item.cr and not errors and count + len(item.lines) <= max_requests:
                    sizes = list(map(len, item.lines))
                    ests = validator.plain_block(item.lines, sizes)
                    if ests is not None:
                        count += len(ests)
                        writer.add_block(item.number, item.offset, sizes, ests, validator.model or "",
                                         validator.block_ids)
                        continue
                lines = block_lines(item, max_bytes)
            for number, data, size, offset in lines:
                # A valid plain line first (no blank line is one): one typed decode, nothing else to read.
                est = plain(data) if data is not None else 0
                if not est and data is not None and (not data or data.isspace()):
                    continue  # blank lines are skipped but keep their numbers
                count += 1
                if count > max_requests:
                    errors.append(BatchError(
                        code="too_many_requests", line=number, param=None,
                        message=f"The batch has more than {max_requests} requests (line "
                                f"{number}); split the file or raise the limit."))
                    stop = True
                    break
                if est:
                    if not errors:  # shorter than grouped_from: group 0
                        add(number, offset, size, est, 0, validator.model or "", validator.last_id)
                    continue
                try:
                    req = validator.general(number, data, size)
                except LineInvalid as e:
                    errors.append(line_error(number, e))
                    errors_bytes += len(errors[-1].model_dump_json())
                    if len(errors) >= settings.validation.max_reported_errors or errors_bytes >= MAX_ERRORS_BYTES:
                        stop = True
                        break
                    continue
                if not errors:
                    group = prefix_groups.of(req.body) if size >= grouped_from else 0
                    add(number, offset, size, req.est_tokens, group, req.model, req.custom_id)
            if stop:
                break
    except InputUnavailable as e:
        # Changed (or gone, or refused) since the batch was created: nothing of it was accepted.
        errors = [BatchError(code=e.code, param=None, line=None, message=f"{e.message} No line of the batch ran.")]
    if not errors and count == 0:
        errors.append(BatchError(code="empty_file", param=None, line=None,
                                 message="The input file has no requests."))
    if errors:
        writer.abandon()
        blobs.delete_prefix(layout.segments_prefix(inp.batch_id))
        return _fail(services, batch, _placed(errors, reader))
    assert reader is not None
    source = reader.pinned()
    _keep_pins(services, file_item, source)
    source = _keep_input(blobs, source, inp.batch_id, batch.expires_at)
    writer.close(source)
    _mark_input(services, file_item, source)
    est_total = sum(s.est for s in writer.index)
    over = check_queue_limits(table, batch.tenant, inp.batch_id, count, est_total, model=validator.model,
                              settings=settings)
    if over is not None:
        blobs.delete_prefix(layout.segments_prefix(inp.batch_id))
        return _fail(services, batch, [over])
    extra: dict[str, Any] = {"request_counts": {"total": count, "completed": 0, "failed": 0}, "model": validator.model,
             "est_tokens": est_total}
    if len(validator.models) > 1:
        extra["ext"] = {**(batch.ext or {}), "models": model_counts(validator.models)}
    try:
        lifecycle.transition(table, inp.batch_id, "in_progress", extra=extra, events=services.batches.events)
    except StorageConflictError:
        # Cancelled (or expired by the sweeper) while validating: keep the totals so Finalize writes a line
        # per request.
        table.update_attributes(BatchRecord, inp.batch_id, set_=extra)
    log.info("validated", extra={"batch_id": inp.batch_id, "requests": count, "est_tokens": est_total})
    return ValidateOutput(batch_id=inp.batch_id, valid=True)


def _first_line_apart(items: Iterator[RawLine | LineBlock]) -> Iterator[RawLine | LineBlock]:
    """split_blocks' items, the first block's first line a block of its own: that line names the batch's model,
    which the block path's decoder is built for, so the rest of its block can take that path."""
    for item in items:
        if isinstance(item, LineBlock) and len(item.lines) > 1:
            first = item.lines[0]
            yield item._replace(lines=[first])
            yield item._replace(number=item.number + 1, offset=item.offset + len(first) + 1, lines=item.lines[1:])
            yield from items
            return
        yield item


def _placed(errors: list[BatchError], reader: InputReader | None) -> list[BatchError]:
    """Errors of an input of several objects name the object and the line in it, beside the line's number."""
    for e in errors:
        where = reader.where(e.line) if e.line is not None and reader is not None else None
        if where is not None:
            e.message = f"{e.message} (line {e.line} is in {where}.)"
    return errors


def _keep_pins(services: Services, file_item: FileRecord, source: InputSource) -> None:
    """The VersionIds Validate's reads learnt of a user's objects (a prefix's listing at create gives none) go on
    the file, so its content and a retry read those versions too."""
    if not source.in_place or not file_item.source_objects:
        return
    objects = [{**o, "version_id": p.version_id} if p.version_id else o
               for o, p in zip(file_item.source_objects, source.parts, strict=True)]
    if objects != file_item.source_objects:
        services.adapters.table.update_attributes(FileRecord, file_item.pk, set_={"source_objects": objects})


def _keep_input(blobs: BlobStore, source: InputSource, batch_id: str,
                expires_at: int | None) -> InputSource:
    """The shards read the input until the batch ends (up to its window plus Finalize, after the sweeper's grace),
    but the bucket's lifecycle deletes it OBJECT_EXPIRY_DAYS after it was written: an input that would go
    before then is written again in place, a server-side copy of the version accepted, which the shards then
    read (files/inputs.py: keep). (An Upload still in parts is composed anew.)"""
    if source.parts or source.in_place or expires_at is None:
        return source
    written = blobs.written_at(source.key)
    if written is not None and written + layout.OBJECT_EXPIRY_DAYS * 86400 < expires_at + KEEP_MARGIN_SECONDS:
        source = source.model_copy(update={"etag": keep(blobs, source.key, source.etag, batch_id,
                                                        layout.INPUT_TAGS)})
        log.info("input rewritten to outlive the batch", extra={"batch_id": batch_id})
    return source


def _mark_input(services: Services, file_item: FileRecord, source: InputSource) -> None:
    """Tags every object the shards will read (layout.INPUT_TAGS): the GPU worker may read no other object of
    files/ or uploads/; and with the file's tenant, which objects stored before they carried it from the start
    lack (tenancy/scope.py). An Upload still in parts: each part, and the composed object if composition finished
    meanwhile (composition checks the parts' tag after it finishes, files/assembly.py, so one of the two sees the
    other). A part already purged was composed: the composed object is tagged then."""
    if source.in_place:
        return  # a user's objects: the worker reads them through the allow-list's grant, not a tag of ours
    blobs = services.adapters.blobs
    tags = {**layout.INPUT_TAGS, **tenant_tags(file_item.tenant)}
    for part in source.parts:
        blobs.tag(part.key, tags)
    if source.parts:
        now_item = services.adapters.table.get_record(FileRecord, file_item.pk)
        if now_item is None or now_item.parts:
            return
    blobs.tag(source.key, tags)


def _fail(services: Services, batch: BatchRecord, errors: list[BatchError]) -> ValidateOutput:
    try:
        lifecycle.transition(services.adapters.table, batch.pk, "failed", extra={
            "errors": {"object": "list", "data": [e.model_dump() for e in errors]},
        }, at=now())
    except StorageConflictError:
        # Cancelled meanwhile: Finalize turns it into `cancelled` with no lines.
        return ValidateOutput(batch_id=batch.pk, valid=True)
    emit(services.settings, {"BatchesFinished": 1}, dimensions={"Status": "failed"})
    log.info("validation failed", extra={"batch_id": batch.pk, "errors": len(errors)})
    return ValidateOutput(batch_id=batch.pk, valid=False)
