"""Message Batches use cases: create from inline requests, retrieve, list, cancel, delete, results — each over the
batches machinery (one BatchRecord, the same workflow, limits and notifications) with `wire="anthropic"`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from nightbatch import layout
from nightbatch.aws.records import BatchRecord
from nightbatch.batches.request import CreateBatchRequest
from nightbatch.clock import now
from nightbatch.errors import InvalidRequestError, NotFoundError, check_range
from nightbatch.files.downloads import Redirect
from nightbatch.jsonl import UndecodableLine, dumps_carried
from nightbatch.listing import after_sort_key
from nightbatch.messages.objects import (
    CUSTOM_ID_RE,
    WIRE,
    CreateMessageBatch,
    DeletedMessageBatch,
    MessageBatch,
    MessageBatchPage,
    MessageBatchRequest,
    batch_id_of,
    ended,
    to_message_batch,
    wire_id,
)
from nightbatch.messages.results import serve
from nightbatch.models.spec import MESSAGES_ENDPOINT
from nightbatch.validation.invalid import LineInvalid
from nightbatch.validation.lines import Validator
from nightbatch.wiring import Services

MAX_LIST_LIMIT = 1000
# Anthropic's window: every Message Batch expires 24 hours after it is created.
WINDOW = "24h"


def _line(i: int, req: MessageBatchRequest) -> bytes:
    """The request as a line of the batch's input. The body was parsed by the standard library, which takes what
    no line can carry (NaN, 1e400, a lone surrogate escape): refused here, naming the request."""
    try:
        data = dumps_carried({"custom_id": req.custom_id, "method": "POST", "url": MESSAGES_ENDPOINT,
                              "body": req.params})
    except UndecodableLine as e:
        raise InvalidRequestError(f"requests.{i}.params: {e.message}", param=f"requests.{i}.params") from None
    return data + b"\n"


def _refusal(i: int, err: LineInvalid) -> InvalidRequestError:
    _code, message, param = err.error
    where = f"requests.{i}" + ("." + param.replace("body", "params", 1).replace("[", ".").replace("]", "")
                               if param else "")
    return InvalidRequestError(f"{where}: {message}", param=where)


def create(services: Services, tenant: str, body: CreateMessageBatch) -> MessageBatch:
    """Every request is checked here, by Validate's own checks, so a refused request is a 400 now rather than a
    batch failed later; the lines are then written to the batch's input object as they are encoded."""
    settings = services.settings
    n = len(body.requests)
    if n == 0:
        raise InvalidRequestError("requests: List should have at least 1 item", param="requests")
    if n > settings.validation.max_requests_per_batch:
        raise InvalidRequestError(f"requests: a batch holds at most {settings.validation.max_requests_per_batch} "
                                  "requests on this deployment", param="requests")
    # The tenant's files and scope answer for images by file id and s3:// URI, as on the OpenAI wires.
    validator = Validator(settings=settings, endpoint=MESSAGES_ENDPOINT, file_images=services.files.images(tenant))
    size = 0
    for i, req in enumerate(body.requests):
        if not CUSTOM_ID_RE.fullmatch(req.custom_id):
            raise InvalidRequestError(f"requests.{i}.custom_id: String should match pattern "
                                      "'^[a-zA-Z0-9_-]{1,64}$'", param=f"requests.{i}.custom_id")
        line = _line(i, req)
        data = line[:-1]
        try:
            validator.check(i + 1, data if len(data) <= settings.validation.max_line_bytes else None, len(data))
        except LineInvalid as e:
            raise _refusal(i, e) from None
        size += len(line)
    if size > settings.validation.max_input_bytes:
        raise InvalidRequestError(f"requests: {size} bytes of requests, over this deployment's "
                                  f"{settings.validation.max_input_bytes}-byte limit per batch", param="requests")
    lines: Iterator[bytes] = (_line(i, r) for i, r in enumerate(body.requests))
    f = services.files.create_lines(tenant, filename="message_batch_requests.jsonl", lines=lines, size=size)
    try:
        batch = services.batches.create(tenant, CreateBatchRequest(
            input_file_id=f.id, endpoint=MESSAGES_ENDPOINT, completion_window=WINDOW), wire=WIRE, total=n)
    except BaseException:
        with contextlib.suppress(Exception):
            services.files.delete(tenant, f.id)
        raise
    return to_message_batch(services.batches.item(tenant, batch.id))


def record(services: Services, tenant: str, message_batch_id: str) -> BatchRecord:
    """The tenant's Message Batch: another tenant's, an OpenAI batch's or a deleted one's id answers as unknown."""
    missing = NotFoundError(f"No message batch found with id '{message_batch_id}'.", param="message_batch_id")
    batch_id = batch_id_of(message_batch_id)
    if batch_id is None:
        raise missing
    try:
        rec = services.batches.item(tenant, batch_id, wire=WIRE)
    except NotFoundError:
        raise missing from None
    if rec.deleted_at is not None:
        raise missing
    return rec


def get(services: Services, tenant: str, message_batch_id: str) -> MessageBatch:
    return to_message_batch(record(services, tenant, message_batch_id))


def _listed(rec: BatchRecord) -> bool:
    return rec.wire == WIRE and rec.deleted_at is None


def _cursor(services: Services, tenant: str, value: str, param: str) -> str | None:
    batch_id = batch_id_of(value)
    if batch_id is None:
        raise InvalidRequestError(f"Invalid '{param}': no message batch with id '{value}'.", param=param)
    return after_sort_key(services.adapters.table, BatchRecord, tenant, batch_id, noun="message batch",
                          belongs=_listed, param=param)


def list_page(services: Services, tenant: str, *, limit: int, before_id: str | None,
              after_id: str | None) -> MessageBatchPage:
    """Newest first. `after_id` (a page's last_id) goes on to older batches, `before_id` (its first_id) back."""
    check_range(limit, 1, MAX_LIST_LIMIT, param="limit")
    if before_id and after_id:
        raise InvalidRequestError("Only one of 'before_id' and 'after_id' may be given.", param="before_id")
    table = services.adapters.table
    owner = BatchRecord.owner_of(tenant)
    if before_id:
        recs, has_more = table.page(BatchRecord, owner, limit=limit, ascending=True, keep=_listed,
                                    after_sk=_cursor(services, tenant, before_id, "before_id"))
        recs.reverse()
    else:
        recs, has_more = table.page(BatchRecord, owner, limit=limit, keep=_listed,
                                    after_sk=_cursor(services, tenant, after_id, "after_id") if after_id else None)
    data = [to_message_batch(r) for r in recs]
    return MessageBatchPage(data=data, has_more=has_more, first_id=data[0].id if data else None,
                            last_id=data[-1].id if data else None)


def cancel(services: Services, tenant: str, message_batch_id: str) -> MessageBatch:
    """Ended or finishing batches answer as they are: Anthropic's cancel of such a batch changes nothing."""
    rec = record(services, tenant, message_batch_id)
    if ended(rec) or rec.status == "finalizing":
        return to_message_batch(rec)
    return to_message_batch(services.batches.cancel_record(tenant, rec.pk, wire=WIRE))


def delete(services: Services, tenant: str, message_batch_id: str) -> DeletedMessageBatch:
    """Only an ended batch, as Anthropic allows: its input and result files go (and the results object made of
    them), its record stays (hidden) for the tenant's usage and cost figures."""
    rec = record(services, tenant, message_batch_id)
    if not ended(rec):
        raise InvalidRequestError(f"Message Batch {message_batch_id} is still processing: cancel it, and delete it "
                                  "once its processing_status is 'ended'.", param="message_batch_id")
    for file_id in (rec.input_file_id, rec.output_file_id, rec.error_file_id):
        if file_id:
            with contextlib.suppress(NotFoundError):
                services.files.delete(tenant, file_id)
    services.adapters.blobs.delete(layout.message_results_key(rec.pk))
    services.adapters.table.update_attributes(BatchRecord, rec.pk, set_={"deleted_at": now()})
    return DeletedMessageBatch(id=wire_id(rec.pk))


def results(services: Services, tenant: str, message_batch_id: str) -> Redirect | Iterator[bytes]:
    """The results' bytes, or past the inline limit a redirect to them (nightbatch/messages/results.py)."""
    rec = record(services, tenant, message_batch_id)
    if not ended(rec):
        raise InvalidRequestError(f"Message Batch {message_batch_id} has not ended yet: its results are available "
                                  "once its processing_status is 'ended'.", param="message_batch_id")
    return serve(services, rec)
