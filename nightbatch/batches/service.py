"""Batches use cases: create (checked at once), retrieve, list newest first, cancel by the lifecycle table."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel

from nightbatch.batches import lifecycle
from nightbatch.batches.objects import to_wire
from nightbatch.batches.options import check_options
from nightbatch.batches.state_changes import StateChanges
from nightbatch.clock import now
from nightbatch.errors import (
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    StorageConflictError,
    check_range,
    check_supported,
)
from nightbatch.files.service import FileService, check_expiry_seconds
from nightbatch.files.user_buckets import output_location, register_input
from nightbatch.ids import new_batch_id
from nightbatch.listing import after_sort_key
from nightbatch.models.spec import ENDPOINTS
from nightbatch.settings import Settings
from nightbatch.storage import Table
from nightbatch.storage.records import BatchRecord
from nightbatch.wire import Batch, ListPage, list_page

MAX_BATCHES_LIMIT = 100
WINDOW_RE = re.compile(r"^([1-9][0-9]{0,2})h$")


class ExpiresAfter(BaseModel):
    anchor: str = "created_at"
    seconds: int


class CreateBatchRequest(BaseModel):
    """Loosely typed so that the use case can answer each problem with OpenAI's own wording."""

    input_file_id: str = ""  # or `nightbatch.input_uri` (nightbatch/files/user_buckets.py)
    endpoint: str
    completion_window: str
    metadata: dict[str, Any] | None = None
    output_expires_after: ExpiresAfter | None = None
    nightbatch: dict[str, Any] | None = None


class Workflow(Protocol):
    """Runs a created batch: Step Functions in AWS, the in-process runner locally."""

    def start(self, batch_id: str) -> None: ...


def window_hours(window: str, max_hours: int) -> int:
    m = WINDOW_RE.match(window)
    hours = int(m.group(1)) if m else 0
    if not 1 <= hours <= max_hours:
        raise InvalidRequestError(
            f"Invalid value: '{window}'. 'completion_window' must be a number of hours between 1h and "
            f"{max_hours}h, such as '24h' or '72h'.",
            param="completion_window", code="invalid_value",
        )
    return hours


def check_metadata(metadata: dict[str, Any] | None) -> None:
    if metadata is None:
        return
    if len(metadata) > 16:
        raise InvalidRequestError(
            f"Invalid 'metadata': too many keys ({len(metadata)}). Expected at most 16 key-value pairs.",
            param="metadata", code="invalid_value",
        )
    for k, v in metadata.items():
        if len(k) > 64:
            raise InvalidRequestError(
                f"Invalid 'metadata': key '{k[:64]}…' is longer than 64 characters.",
                param=f"metadata.{k[:64]}", code="invalid_value",
            )
        if not isinstance(v, str):
            raise InvalidRequestError(
                f"Invalid type for 'metadata.{k}': expected a string, but got {_json_type(v)} instead.",
                param=f"metadata.{k}", code="invalid_type",
            )
        if len(v) > 512:
            raise InvalidRequestError(
                f"Invalid 'metadata.{k}': string too long. Expected a string with maximum length 512, "
                f"but got a string with length {len(v)} instead.",
                param=f"metadata.{k}", code="invalid_value",
            )


def _json_type(v: Any) -> str:
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int | float):
        return "a number"
    if isinstance(v, list):
        return "an array"
    if isinstance(v, dict):
        return "an object"
    return "null" if v is None else "a value"


@dataclass(kw_only=True)
class BatchService:
    settings: Settings
    table: Table
    files: FileService
    workflow: Workflow
    events: StateChanges | None = None  # EventBridge state changes (batches/state_changes.py), when configured

    def create(self, tenant: str, req: CreateBatchRequest, *, batch_id: str | None = None,
               ext: dict[str, Any] | None = None) -> Batch:
        check_supported(req.endpoint, ENDPOINTS, param="endpoint")
        hours = window_hours(req.completion_window, self.settings.validation.max_completion_window_hours)
        check_metadata(req.metadata)
        # Known keys only, a few KB at most; a bad e-mail address is a 400 now rather than a dropped e-mail later.
        check_options(req.nightbatch, self.settings)
        if req.output_expires_after is not None:
            check_supported(req.output_expires_after.anchor, ("created_at",), param="output_expires_after.anchor")
            check_expiry_seconds(req.output_expires_after.seconds, "output_expires_after.seconds")
        batch_id = batch_id or new_batch_id()
        input_file_id, where = self._input(tenant, req, batch_id)
        ext = {**(ext or {}), **where}
        created = now()
        rec = BatchRecord(
            pk=batch_id, tenant=tenant, status="validating", endpoint=req.endpoint,
            input_file_id=input_file_id, completion_window=req.completion_window, created_at=created,
            expires_at=created + int(hours * self.settings.validation.hour_seconds),
            request_counts={"total": 0, "completed": 0, "failed": 0}, metadata=req.metadata,
            output_expires_after_seconds=req.output_expires_after.seconds if req.output_expires_after else None,
            options=req.nightbatch or None, ext=ext or None,
        )
        self.table.put_record(rec, new=True)
        # A failed start leaves the batch in `validating`; the sweeper re-drives it. Started before the event is
        # put: a slow bus must not hold the workflow (nor the request, past API Gateway's 29 s) once the record
        # is written.
        self.workflow.start(batch_id)
        if self.events is not None:
            self.events.publish(rec)
        return to_wire(rec)

    def _input(self, tenant: str, req: CreateBatchRequest, batch_id: str) -> tuple[str, dict[str, str]]:
        """The batch's input file id (a file over `nightbatch.input_uri`'s objects, made now, or the checked
        `input_file_id`) and where its input and output are in the user's buckets, for the batch object."""
        options = req.nightbatch or {}
        where = {}
        if "output_uri" in options:
            where["output_uri"] = output_location(options["output_uri"], batch_id)
        if "input_uri" not in options:
            if not req.input_file_id:
                raise InvalidRequestError("Missing required parameter: 'input_file_id'.", param="input_file_id",
                                          code="missing_required_parameter")
            self._check_input_file(tenant, req.input_file_id)
            return req.input_file_id, where
        if req.input_file_id:
            raise InvalidRequestError("Give 'input_file_id' or 'nightbatch.input_uri', not both.",
                                      param="nightbatch.input_uri", code="invalid_value")
        where["input_uri"] = options["input_uri"]
        return register_input(self.files, tenant, options["input_uri"]).id, where

    def _check_input_file(self, tenant: str, file_id: str) -> None:
        # ARCHITECTURE decision 10: missing, another tenant's, or not purpose=batch -> one answer.
        try:
            f = self.files.get(tenant, file_id)
            ok = f.purpose == "batch" and f.status != "error"  # "error": an upload that failed its md5 check
        except NotFoundError:
            ok = False
        if ok and f.status != "processed":
            # Only a fully processed file: "uploaded" is an Upload whose md5 is still being checked.
            raise InvalidRequestError(
                f"Invalid 'input_file_id': '{file_id}'. The file is still being processed (status "
                f"'{f.status}'); create the batch once its status is 'processed'.",
                param="input_file_id", code="file_not_ready")
        if not ok:
            raise InvalidRequestError(
                f"Invalid 'input_file_id': '{file_id}'. The file does not exist or was not uploaded "
                "with purpose 'batch'.",
                param="input_file_id", code="invalid_value",
            )

    def item(self, tenant: str, batch_id: str) -> BatchRecord:
        return self.table.require_owned(BatchRecord, tenant, batch_id, param="batch_id",
                                        missing=f"No batch found with id '{batch_id}'.")

    def get(self, tenant: str, batch_id: str) -> Batch:
        return to_wire(self.item(tenant, batch_id))

    def list(self, tenant: str, *, limit: int, after: str | None) -> ListPage[Batch]:
        check_range(limit, 1, MAX_BATCHES_LIMIT, param="limit")
        after_sk = after_sort_key(self.table, BatchRecord, tenant, after, noun="batch")
        recs, has_more = self.table.page(BatchRecord, BatchRecord.owner_of(tenant), limit=limit, after_sk=after_sk)
        return list_page([to_wire(r) for r in recs], has_more)

    def cancel(self, tenant: str, batch_id: str) -> Batch:
        rec = self.item(tenant, batch_id)
        for _ in range(5):
            status = rec.status
            if status in ("cancelling", "cancelled"):
                return to_wire(rec)
            if status not in lifecycle.TRANSITIONS["cancelling"]:
                raise ConflictError(f"Cannot cancel a batch with status '{status}'.")
            try:
                return to_wire(lifecycle.transition(self.table, batch_id, "cancelling", from_=(status,),
                                                          events=self.events))
            except StorageConflictError:
                rec = self.item(tenant, batch_id)  # lost a race: decide again on the fresh status
        raise ConflictError("The batch changed while it was being cancelled; try again.", retry=True)
