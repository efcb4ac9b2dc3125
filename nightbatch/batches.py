"""Batches use cases: create (checked at once), retrieve, list newest first, cancel by the lifecycle table."""

from __future__ import annotations

import re
from typing import Any, Protocol

from pydantic import BaseModel

from nightbatch import lifecycle
from nightbatch.clock import now, sort_key
from nightbatch.errors import ConflictError, InvalidRequestError, NotFoundError, StorageConflictError
from nightbatch.files import FileService, check_expiry_seconds, page
from nightbatch.ids import new_batch_id
from nightbatch.options import check_options
from nightbatch.settings import ENDPOINTS, Settings
from nightbatch.storage import Table
from nightbatch.wire import Batch, BatchErrors, ListPage, RequestCounts, Usage

MAX_BATCHES_LIMIT = 100
WINDOW_RE = re.compile(r"^([1-9][0-9]{0,2})h$")


class ExpiresAfter(BaseModel):
    anchor: str = "created_at"
    seconds: int


class CreateBatchRequest(BaseModel):
    """Loosely typed so that the use case can answer each problem with OpenAI's own wording."""

    input_file_id: str
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


def to_wire(item: dict[str, Any]) -> Batch:
    errors = item.get("errors")
    usage = item.get("usage")
    counts = item.get("request_counts") or {}
    ext = dict(item.get("ext") or {})
    if item["status"] in ("in_progress", "cancelling", "finalizing"):
        # Live progress: atomic adds from the workers (final numbers come from the files at finalize).
        counts = {
            "total": counts.get("total", 0),
            "completed": min(item.get("live_completed", 0), counts.get("total", 0)),
            "failed": min(item.get("live_failed", 0), counts.get("total", 0)),
        }
        if "live_input_tokens" in item or "live_output_tokens" in item:
            # Tokens so far, for tokens/s in the CLI and the dashboard; `usage` stays final-only.
            live_in, live_out = item.get("live_input_tokens", 0), item.get("live_output_tokens", 0)
            ext["live_usage"] = {"input_tokens": live_in, "output_tokens": live_out,
                                 "total_tokens": live_in + live_out}
    return Batch(
        id=item["pk"], endpoint=item["endpoint"], model=item.get("model"),
        errors=BatchErrors.model_validate(errors) if errors else None,
        input_file_id=item["input_file_id"], completion_window=item["completion_window"],
        status=item["status"], output_file_id=item.get("output_file_id"),
        error_file_id=item.get("error_file_id"), created_at=item["created_at"],
        in_progress_at=item.get("in_progress_at"), expires_at=item.get("expires_at"),
        finalizing_at=item.get("finalizing_at"), completed_at=item.get("completed_at"),
        failed_at=item.get("failed_at"), expired_at=item.get("expired_at"),
        cancelling_at=item.get("cancelling_at"), cancelled_at=item.get("cancelled_at"),
        request_counts=RequestCounts.model_validate(counts),
        usage=Usage.model_validate(usage) if usage else None,
        metadata=item.get("metadata"), nightbatch=ext or None,
    )


class BatchService:
    def __init__(self, *, settings: Settings, table: Table, files: FileService, workflow: Workflow) -> None:
        self.settings = settings
        self.table = table
        self.files = files
        self.workflow = workflow

    def create(self, tenant: str, req: CreateBatchRequest, *, batch_id: str | None = None) -> Batch:
        if req.endpoint not in ENDPOINTS:
            raise InvalidRequestError(
                f"Invalid value: '{req.endpoint}'. Supported values are: "
                + ", ".join(f"'{e}'" for e in ENDPOINTS) + ".",
                param="endpoint", code="invalid_value",
            )
        hours = window_hours(req.completion_window, self.settings.max_completion_window_hours)
        check_metadata(req.metadata)
        # Known keys only, a few KB at most; a bad e-mail address is a 400 now rather than a dropped e-mail later.
        check_options(req.nightbatch, self.settings)
        if req.output_expires_after is not None:
            if req.output_expires_after.anchor != "created_at":
                raise InvalidRequestError(
                    f"Invalid value: '{req.output_expires_after.anchor}'. Supported values are: 'created_at'.",
                    param="output_expires_after.anchor", code="invalid_value",
                )
            check_expiry_seconds(req.output_expires_after.seconds, "output_expires_after.seconds")
        self._check_input_file(tenant, req.input_file_id)
        batch_id = batch_id or new_batch_id()
        created = now()
        item: dict[str, Any] = {
            "pk": batch_id, "kind": "batch", "tenant": tenant, "owner": f"{tenant}#batch",
            "owner_sk": sort_key(created, batch_id), "created_sk": sort_key(created, batch_id),
            "open_status": "validating", "status": "validating", "endpoint": req.endpoint,
            "input_file_id": req.input_file_id, "completion_window": req.completion_window,
            "created_at": created,
            "expires_at": created + int(hours * self.settings.hour_seconds),
            "request_counts": {"total": 0, "completed": 0, "failed": 0},
            "metadata": req.metadata,
        }
        if req.output_expires_after is not None:
            item["output_expires_after_seconds"] = req.output_expires_after.seconds
        if req.nightbatch:
            item["options"] = req.nightbatch
        self.table.put_new(item)
        # A failed start leaves the batch in `validating`; the sweeper re-drives it.
        self.workflow.start(batch_id)
        return to_wire(item)

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

    def item(self, tenant: str, batch_id: str) -> dict[str, Any]:
        item = self.table.get(batch_id) if batch_id.startswith("batch_") else None
        if item is None or item.get("kind") != "batch" or item.get("tenant") != tenant:
            raise NotFoundError(f"No batch found with id '{batch_id}'.", param="batch_id")
        return item

    def get(self, tenant: str, batch_id: str) -> Batch:
        return to_wire(self.item(tenant, batch_id))

    def list(self, tenant: str, *, limit: int, after: str | None) -> ListPage[Batch]:
        if not 1 <= limit <= MAX_BATCHES_LIMIT:
            raise InvalidRequestError(
                f"Invalid 'limit': {limit}. Expected a value between 1 and {MAX_BATCHES_LIMIT}.",
                param="limit", code="invalid_value",
            )
        after_sk = None
        if after:
            cursor = self.table.get(after)
            if cursor is None or cursor.get("kind") != "batch" or cursor.get("tenant") != tenant:
                raise InvalidRequestError(f"Invalid 'after': no batch with id '{after}'.", param="after")
            after_sk = str(cursor["owner_sk"])
        data: list[Batch] = []
        has_more = False
        for item in self.table.query_owner(
            f"{tenant}#batch", ascending=False, after_sk=after_sk, page_size=limit + 1
        ):
            if len(data) == limit:
                has_more = True
                break
            data.append(to_wire(item))
        return page(data, has_more)

    def cancel(self, tenant: str, batch_id: str) -> Batch:
        item = self.item(tenant, batch_id)
        for _ in range(5):
            status = item["status"]
            if status in ("cancelling", "cancelled"):
                return to_wire(item)
            if status not in lifecycle.TRANSITIONS["cancelling"]:
                raise ConflictError(f"Cannot cancel a batch with status '{status}'.")
            try:
                item = lifecycle.transition(self.table, batch_id, "cancelling", from_=(status,))
                return to_wire(item)
            except StorageConflictError:
                item = self.item(tenant, batch_id)  # lost a race: decide again on the fresh status
        raise ConflictError("The batch changed while it was being cancelled; try again.", retry=True)
