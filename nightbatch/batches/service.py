"""Batches use cases: create (within the tenant's in-flight limit, checked at once by batches/request.py),
retrieve, list newest first, cancel by the lifecycle table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from nightbatch.aws import Table
from nightbatch.aws.records import BatchRecord
from nightbatch.batches import lifecycle
from nightbatch.batches.objects import to_wire
from nightbatch.batches.request import CheckedCreate, CreateBatchRequest, check_create
from nightbatch.clock import now
from nightbatch.errors import ConflictError, NotFoundError, StorageConflictError, check_range
from nightbatch.files.service import FileService
from nightbatch.files.user_buckets import output_location, register_input
from nightbatch.ids import new_batch_id
from nightbatch.listing import after_sort_key
from nightbatch.settings import Settings
from nightbatch.tenancy.limits import admit_batch, release_batch_slot
from nightbatch.wire import Batch, ListPage, list_page

MAX_BATCHES_LIMIT = 100


class Workflow(Protocol):
    """Runs a created batch: Step Functions in AWS, the in-process runner locally."""

    def start(self, batch_id: str) -> None: ...


def _openai(rec: BatchRecord) -> bool:
    return rec.wire == "openai"


@dataclass(kw_only=True)
class BatchService:
    settings: Settings
    table: Table
    files: FileService
    workflow: Workflow
    events: lifecycle.StateChangeEvents | None = None  # EventBridge (notifications/state_changes.py), when configured

    def create(self, tenant: str, req: CreateBatchRequest, *, ext: dict[str, Any] | None = None,
               wire: str = "openai", total: int = 0) -> Batch:
        """A batch within the tenant's in-flight limit: a slot taken for its id first (a 429 when none is left),
        given back when the create does not happen after all. `total`: the requests the caller already counted
        (the Anthropic wire's inline requests; OpenAI's batches show 0 until Validate has counted the input
        file)."""
        batch_id = new_batch_id()
        admit_batch(self.table, tenant, batch_id, settings=self.settings)
        try:
            return self._create(tenant, req, batch_id, ext=ext, wire=wire, total=total)
        except BaseException:
            release_batch_slot(self.table, tenant, batch_id)
            raise

    def _create(self, tenant: str, req: CreateBatchRequest, batch_id: str, *, ext: dict[str, Any] | None,
                wire: str, total: int) -> Batch:
        checked = check_create(tenant, req, settings=self.settings, files=self.files, wire=wire)
        input_file_id, where = self._input(tenant, req, checked, batch_id)
        ext = {**(ext or {}), **where}
        created = now()
        rec = BatchRecord(
            pk=batch_id, tenant=tenant, status="validating", endpoint=req.endpoint,
            input_file_id=input_file_id, completion_window=req.completion_window, created_at=created,
            expires_at=created + int(checked.hours * self.settings.validation.hour_seconds),
            request_counts={"total": total, "completed": 0, "failed": 0}, metadata=req.metadata,
            output_expires_after_seconds=req.output_expires_after.seconds if req.output_expires_after else None,
            options=req.nightbatch or None, ext=ext or None, wire=wire,
        )
        self.table.put_record(rec, new=True)
        # A failed start leaves the batch in `validating`; the sweeper re-drives it. Started before the event is
        # put: a slow bus must not hold the workflow (nor the request, past API Gateway's 29 s) once the record
        # is written.
        self.workflow.start(batch_id)
        if self.events is not None:
            self.events.publish(rec)
        return to_wire(rec)

    def _input(self, tenant: str, req: CreateBatchRequest, checked: CheckedCreate,
               batch_id: str) -> tuple[str, dict[str, str]]:
        """The batch's input file id (checked `input_file_id`, or a file made now over `nightbatch.input_uri`'s
        objects) and where its input and output are in the user's buckets, for the batch object."""
        options = req.nightbatch or {}
        uris = checked.uris
        where = {}
        if "output_order" in options:  # shown on the batch object; Finalize reads it (default "completion")
            where["output_order"] = options["output_order"]
        if uris.output is not None:
            where["output_uri"] = output_location(uris.output, batch_id)
        if uris.input is None:
            return req.input_file_id, where
        where["input_uri"] = options["input_uri"]
        return register_input(self.files, tenant, uris.input).id, where

    def item(self, tenant: str, batch_id: str, *, wire: str | None = None) -> BatchRecord:
        """The tenant's batch (of that wire, when one is named: the other wire's id is answered as unknown)."""
        missing = f"No batch found with id '{batch_id}'."
        rec = self.table.require_owned(BatchRecord, tenant, batch_id, param="batch_id", missing=missing)
        if wire is not None and rec.wire != wire:
            raise NotFoundError(missing, param="batch_id")
        return rec

    def get(self, tenant: str, batch_id: str) -> Batch:
        return to_wire(self.item(tenant, batch_id, wire="openai"))

    def list(self, tenant: str, *, limit: int, after: str | None) -> ListPage[Batch]:
        check_range(limit, 1, MAX_BATCHES_LIMIT, param="limit")
        after_sk = after_sort_key(self.table, BatchRecord, tenant, after, noun="batch", belongs=_openai)
        recs, has_more = self.table.page(BatchRecord, BatchRecord.owner_of(tenant), limit=limit, after_sk=after_sk,
                                         keep=_openai)
        return list_page([to_wire(r) for r in recs], has_more)

    def cancel(self, tenant: str, batch_id: str, *, wire: str = "openai") -> Batch:
        return to_wire(self.cancel_record(tenant, batch_id, wire=wire))

    def cancel_record(self, tenant: str, batch_id: str, *, wire: str) -> BatchRecord:
        rec = self.item(tenant, batch_id, wire=wire)
        for _ in range(5):
            status = rec.status
            if status in ("cancelling", "cancelled"):
                return rec
            if status not in lifecycle.TRANSITIONS["cancelling"]:
                raise ConflictError(f"Cannot cancel a batch with status '{status}'.")
            try:
                return lifecycle.transition(self.table, batch_id, "cancelling", from_=(status,), events=self.events)
            except StorageConflictError:
                rec = self.item(tenant, batch_id, wire=wire)  # lost a race: decide again on the fresh status
        raise ConflictError("The batch changed while it was being cancelled; try again.", retry=True)
