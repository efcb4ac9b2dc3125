"""Batch events: exactly one per terminal transition, recorded with the exact body bytes every delivery sends."""

from __future__ import annotations

import json
import secrets
from typing import Any

from nightbatch.aws import Table
from nightbatch.aws.records import BatchRecord, EventRecord
from nightbatch.clock import now, sort_key
from nightbatch.errors import StorageConflictError

PENDING = EventRecord.PENDING
EVENT_TYPES: dict[str, str] = {
    "completed": "batch.completed", "failed": "batch.failed", "expired": "batch.expired",
    "cancelled": "batch.cancelled",
}


def event_pk(batch_id: str, status: str) -> str:
    # Keyed by the transition, not by the event id: a second Notify finds the first one's event.
    return EventRecord.pk_of(batch_id, status)


def new_event_id() -> str:
    return f"evt_{secrets.token_hex(16)}"


def event_body(event_id: str, event_type: str, created_at: int, data_id: str) -> str:
    """OpenAI's thin payload (docs/ARCHITECTURE.md "The OpenAI wire contract", point 7), compact; signed and sent
    byte for byte as stored."""
    return json.dumps(
        {"id": event_id, "object": "event", "type": event_type, "created_at": created_at, "data": {"id": data_id}},
        separators=(",", ":"),
    )


def record_event(table: Table, batch: BatchRecord) -> tuple[EventRecord, bool]:
    """The event of the batch's terminal status: (event, True) when this call created it, else the existing one."""
    status = batch.status
    event_type = EVENT_TYPES[status]
    event_id = new_event_id()
    created_at = int(getattr(batch, f"{status}_at", None) or now())
    event = EventRecord(
        pk=event_pk(batch.pk, status), event_id=event_id, type=event_type, tenant=batch.tenant,
        batch_id=batch.pk, status=status, created_at=created_at,
        body=event_body(event_id, event_type, created_at, batch.pk),
        # Sparse status index: until every channel is done, the sweeper can find the event and re-drive it.
        open_status=PENDING, created_sk=sort_key(created_at, event_id),
    )
    try:
        table.put_record(event, new=True)
    except StorageConflictError:
        existing = table.get_record(EventRecord, event.pk)
        if existing is None:  # deleted in between: nothing sensible to add; try once more
            table.put_record(event, new=True)
            return event, True
        return existing, False
    return event, True


def mark_event(table: Table, pk: str, field: str, value: Any) -> None:
    table.update_attributes(EventRecord, pk, set_={field: value})


def close_event(table: Table, pk: str) -> None:
    """Every channel of the event is done: the sweeper stops re-driving it."""
    table.update_attributes(EventRecord, pk, remove=("open_status", "created_sk"))
