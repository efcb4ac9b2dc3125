"""The Anthropic wire's objects, with the field names of Anthropic's API reference (SDK 2.16.0's
types/messages/): MessageBatch as a batch record shows it, its list page, the deleted answer.

A Message Batch is one of our batches (`BatchRecord.wire == "anthropic"`, endpoint /v1/messages); its id is
the batch id with `msgbatch_` for `batch_` (`msgbatch_ab12…` is `batch_ab12…` in events and the extensions).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from nightbatch.aws.records import BatchRecord
from nightbatch.wire import TERMINAL_STATUSES

WIRE = "anthropic"
ID_PREFIX = "msgbatch_"
_BATCH_PREFIX = "batch_"
CUSTOM_ID_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
def wire_id(batch_id: str) -> str:
    return ID_PREFIX + batch_id.removeprefix(_BATCH_PREFIX)


def batch_id_of(message_batch_id: str) -> str | None:
    """Our batch id for a Message Batch id; None for an id that is not one."""
    if not message_batch_id.startswith(ID_PREFIX) or len(message_batch_id) == len(ID_PREFIX):
        return None
    return _BATCH_PREFIX + message_batch_id.removeprefix(ID_PREFIX)


def rfc3339(ts: int | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class MessageBatchRequest(BaseModel):
    custom_id: str
    params: dict[str, Any]


class CreateMessageBatch(BaseModel):
    requests: list[MessageBatchRequest]


class MessageBatchRequestCounts(BaseModel):
    processing: int = 0
    succeeded: int = 0
    errored: int = 0
    canceled: int = 0
    expired: int = 0


class MessageBatch(BaseModel):
    id: str
    type: Literal["message_batch"] = "message_batch"
    processing_status: Literal["in_progress", "canceling", "ended"]
    request_counts: MessageBatchRequestCounts = Field(default_factory=MessageBatchRequestCounts)
    ended_at: str | None = None
    created_at: str
    expires_at: str
    cancel_initiated_at: str | None = None
    archived_at: str | None = None
    results_url: str | None = None


class MessageBatchPage(BaseModel):
    data: list[MessageBatch]
    has_more: bool = False
    first_id: str | None = None
    last_id: str | None = None


class DeletedMessageBatch(BaseModel):
    id: str
    type: Literal["message_batch_deleted"] = "message_batch_deleted"


def ended(rec: BatchRecord) -> bool:
    return rec.status in TERMINAL_STATUSES


def to_message_batch(rec: BatchRecord) -> MessageBatch:
    """As Anthropic counts: every request `processing` until the batch ends, then each in its outcome."""
    counts = rec.request_counts or {}
    total = int(counts.get("total", 0))
    if not ended(rec):
        status: Literal["in_progress", "canceling", "ended"] = (
            "canceling" if rec.status == "cancelling" or rec.cancelling_at is not None else "in_progress")
        tally = MessageBatchRequestCounts(processing=total)
    elif rec.status == "failed":  # the input was refused as a whole (e.g. a queue limit): every request errored
        status, tally = "ended", MessageBatchRequestCounts(errored=total)
    else:
        unrun = rec.unrun_counts or {}
        canceled, expired = int(unrun.get("batch_cancelled", 0)), int(unrun.get("batch_expired", 0))
        status = "ended"
        tally = MessageBatchRequestCounts(succeeded=int(counts.get("completed", 0)), canceled=canceled,
                                          expired=expired,
                                          errored=max(int(counts.get("failed", 0)) - canceled - expired, 0))
    mid = wire_id(rec.pk)
    ended_at = rec.completed_at or rec.failed_at or rec.expired_at or rec.cancelled_at
    return MessageBatch(
        id=mid, processing_status=status, request_counts=tally,
        ended_at=rfc3339(ended_at) if status == "ended" else None,
        created_at=rfc3339(rec.created_at) or "", expires_at=rfc3339(rec.expires_at or rec.created_at) or "",
        cancel_initiated_at=rfc3339(rec.cancelling_at),
        # Relative: the SDK joins it to its base URL, which behind API Gateway includes the stage's path.
        results_url=f"/v1/messages/batches/{mid}/results" if status == "ended" else None,
    )
