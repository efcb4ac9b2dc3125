"""Retry: a new batch of some lines of an ended one, their original bytes copied from its input file.

Which lines: those whose error-file line has one of the given codes (by default the lines that never ran), or
an explicit custom_id list. Both are held as custom_id digests (nightbatch.ids) while the input file is
streamed into the new batch's input file: memory holds one fixed-size digest per selected line, never a line
or a file. The copy runs inside the API request; in AWS a very large input could outlast API Gateway's 29 s.
The batches are linked both ways under `nightbatch`: `retry_of` on the new one, `retried_by` (every retry,
oldest first) on the one retried. Endpoint, window, metadata, options (notifications, `output_uri`: not
`input_uri`, the lines being copied) and output expiry are the retried batch's unless the request overrides them.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel, ConfigDict

from nightbatch.aws.records import BatchRecord, FileRecord
from nightbatch.batches.request import CreateBatchRequest, ExpiresAfter
from nightbatch.errors import ConflictError, InvalidRequestError, NotFoundError, StorageConflictError
from nightbatch.files.inputs import InputUnavailable
from nightbatch.ids import custom_id_digest, new_file_id
from nightbatch.jsonl import UndecodableLine, loads, split_lines
from nightbatch.layout import file_key
from nightbatch.results.lines import MAX_RESULT_LINE, summarize_result_line
from nightbatch.tenancy.limits import QUOTA_ATTR, reserve_storage
from nightbatch.tenancy.scope import tenant_tags
from nightbatch.wire import TERMINAL_STATUSES, Batch
from nightbatch.wiring import Services

log = logging.getLogger("nightbatch.batches.retry")
DEFAULT_CODES = ("shard_failed", "batch_expired", "batch_cancelled")
MAX_CUSTOM_IDS = 100_000  # an explicit list travels in the request body (the body-limit middleware caps it too)


class RetryRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    error_codes: list[str] | None = None
    custom_ids: list[str] | None = None
    completion_window: str | None = None
    metadata: dict[str, Any] | None = None
    output_expires_after: ExpiresAfter | None = None
    nightbatch: dict[str, Any] | None = None  # merged over the retried batch's options, key by key


def retry_batch(services: Services, tenant: str, batch_id: str, req: RetryRequest) -> Batch:
    old = services.batches.item(tenant, batch_id)  # another tenant's batch: 404, as a missing one
    if old.status not in TERMINAL_STATUSES:
        raise ConflictError(
            f"Batch {batch_id} is {old.status}; only a batch that has ended (completed, failed, expired or "
            "cancelled) can be retried.", code="batch_not_ended")
    if req.error_codes is not None and req.custom_ids is not None:
        raise InvalidRequestError("Give either 'error_codes' or 'custom_ids', not both.", param="custom_ids",
                                  code="invalid_value")
    source = _input_file(services, tenant, old)
    if req.custom_ids is not None:
        if not 1 <= len(req.custom_ids) <= MAX_CUSTOM_IDS:
            raise InvalidRequestError(f"'custom_ids' must list 1 to {MAX_CUSTOM_IDS} custom_ids.",
                                      param="custom_ids", code="invalid_value")
        wanted = {custom_id_digest(c) for c in req.custom_ids}
    else:
        codes = set(req.error_codes if req.error_codes is not None else DEFAULT_CODES)
        wanted = _failed_with(services, tenant, old, codes)
    file_id, lines = _write_input(services, tenant, old, source, wanted)
    if req.custom_ids is not None and wanted:
        missing = [c for c in req.custom_ids if custom_id_digest(c) in wanted][:5]
        _drop_file(services, tenant, file_id)
        raise InvalidRequestError(
            f"Batch {batch_id}'s input has no line with custom_id {', '.join(repr(c) for c in missing)}.",
            param="custom_ids", code="invalid_value")
    create = CreateBatchRequest(
        input_file_id=file_id, endpoint=old.endpoint,
        completion_window=req.completion_window or old.completion_window,
        metadata=req.metadata if req.metadata is not None else old.metadata,
        output_expires_after=req.output_expires_after or (
            ExpiresAfter(seconds=old.output_expires_after_seconds) if old.output_expires_after_seconds else None),
        nightbatch={**_inherited_options(old), **(req.nightbatch or {})} or None,
    )
    try:
        new = services.batches.create(tenant, create, ext={"retry_of": batch_id, "retry_lines": lines})
    except BaseException:
        _drop_file(services, tenant, file_id)
        raise
    _link(services, old, new.id)
    log.info("batch %s retried as %s (%d lines)", batch_id, new.id, lines, extra={"batch_id": batch_id})
    return new


def _inherited_options(old: BatchRecord) -> dict[str, Any]:
    """The retried batch's options, but where its input was read: the retry's input is a new file of the selected
    lines (even when the old one was read in place from `input_uri`); `output_uri` and the rest carry over."""
    return {k: v for k, v in (old.options or {}).items() if k != "input_uri"}


def _input_file(services: Services, tenant: str, old: BatchRecord) -> FileRecord:
    try:
        return services.files.item(tenant, old.input_file_id)
    except NotFoundError:
        raise ConflictError(
            f"Batch {old.pk} cannot be retried: its input file {old.input_file_id} no longer exists (deleted "
            "or expired). Upload the lines again and create a batch.", code="input_file_gone") from None


def _failed_with(services: Services, tenant: str, old: BatchRecord, codes: set[str]) -> set[int]:
    """Digests of the custom_ids whose error line has one of `codes`."""
    if not old.error_file_id:
        raise InvalidRequestError(f"Batch {old.pk} has no error file: none of its lines failed.",
                                  param="error_codes", code="no_matching_lines")
    try:
        errors = services.files.item(tenant, old.error_file_id)
    except NotFoundError:
        raise ConflictError(
            f"Batch {old.pk} cannot be retried by error code: its error file {old.error_file_id} no longer "
            "exists (deleted or expired). Retry it with an explicit 'custom_ids' list.",
            code="error_file_gone") from None
    wanted: set[int] = set()
    for data in _lines(services, errors):
        try:
            line = summarize_result_line(data)
        except (ValueError, KeyError, TypeError, AttributeError):
            continue  # not a result line (Finalize writes none such)
        if line.code in codes:
            wanted.add(custom_id_digest(line.custom_id))
    if not wanted:
        raise InvalidRequestError(
            f"Batch {old.pk} has no line that failed with {', '.join(sorted(codes))}.",
            param="error_codes", code="no_matching_lines")
    return wanted


def _lines(services: Services, item: FileRecord) -> Iterator[bytes]:
    for raw in split_lines(services.files.chunks(item, read_ahead=True), max_bytes=MAX_RESULT_LINE):
        if raw.data:
            yield raw.data


def _write_input(services: Services, tenant: str, old: BatchRecord, source: FileRecord,
                 wanted: set[int]) -> tuple[str, int]:
    """Streams the wanted lines of the old input into a new input file; each found digest leaves `wanted`.
    Returns the new file's id and its line count."""
    blobs = services.files.blobs
    file_id = new_file_id()
    key = file_key(file_id)
    writer = blobs.writer(key, tags=tenant_tags(tenant))  # a shard's input: its tenant's from the start
    lines = 0
    try:
        # Read as Validate read it: the version accepted, each object of an in-place input a file of its own.
        for raw in services.files.lines(source, max_bytes=MAX_RESULT_LINE, read_ahead=True):
            if not raw.data:
                continue
            try:
                d = custom_id_digest(loads(raw.data)["custom_id"])
            except (UndecodableLine, KeyError, TypeError):
                continue  # not a request line: Validate refused it the first time
            if d in wanted:
                wanted.discard(d)  # a custom_id once (the first line of it, as Validate kept it)
                writer.write(raw.data + b"\n")
                lines += 1
        size = writer.close()
    except InputUnavailable as e:
        writer.abort()
        raise ConflictError(f"Batch {old.pk} cannot be retried: {e.message} Its lines can no longer be read as "
                            "the batch accepted them; upload them again and create a batch.", code=e.code) from None
    except BaseException:
        writer.abort()
        raise
    if lines == 0:
        blobs.delete(key)
        raise InvalidRequestError(f"Batch {old.pk}'s input file has none of the lines asked for.",
                                  param="custom_ids", code="no_matching_lines")
    try:
        reserve_storage(services.adapters.table, tenant, size, settings=services.settings)
    except BaseException:
        blobs.delete(key)
        raise
    services.files.register(tenant, file_id=file_id, key=key, size=size, filename=f"{old.pk}_retry.jsonl",
                            purpose="batch", extra={QUOTA_ATTR: size, "etag": services.files.etag(file_id)})
    return file_id, lines


def _drop_file(services: Services, tenant: str, file_id: str) -> None:
    with contextlib.suppress(NotFoundError):
        services.files.delete(tenant, file_id)


def _link(services: Services, old: BatchRecord, new_id: str) -> None:
    """`retried_by` on the retried batch (ended: nothing else writes its record any more)."""
    ext = dict(old.ext or {})
    ext["retried_by"] = [*ext.get("retried_by", []), new_id]
    try:
        services.adapters.table.update_attributes(BatchRecord, old.pk, set_={"ext": ext},
                                                  expect_in={"status": (old.status,)})
    except StorageConflictError:
        log.error("batch %s: retry %s not recorded on it", old.pk, new_id, extra={"batch_id": old.pk})
