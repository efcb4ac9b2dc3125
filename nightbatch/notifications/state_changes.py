"""Batch state-change events on EventBridge: one per transition, on the account's default bus unless configured.

The AWS-native twin of webhooks, shaped like Amazon Bedrock's "Batch Inference Job State Change" event (one
`detail-type`, the job's new status and its record counts in `detail`), so the same rules and targets work.
The schema is documented in docs/NOTIFICATIONS.md and is `version`ed.

A transition never fails because of its event: the transitions into validating, in_progress, cancelling and
finalizing are put once, right after the write, and a failure is logged. The terminal one (completed, failed,
expired, cancelled) is a channel of the Notify step (nightbatch/notifications/notifier.py), so it is retried with
webhooks, SNS and e-mail until it is accepted, and the sweeper re-drives it after that.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from nightbatch.aws.eventbus import EventBus
from nightbatch.aws.records import BatchRecord
from nightbatch.batches.objects import to_wire

log = logging.getLogger("nightbatch.batches.state_changes")

SOURCE = "nightbatch"
DETAIL_TYPE = "Nightbatch Batch State Change"
VERSION = "1"
# The open statuses in the order a batch can pass them; a terminal status comes after all of them.
_OPEN_ORDER = ("validating", "in_progress", "cancelling", "finalizing")


def previous_status(rec: BatchRecord) -> str | None:
    """The status the batch left, read from its timestamps (the lifecycle's order is fixed, see lifecycle.py)."""
    if rec.status == "validating":
        return None
    before = _OPEN_ORDER[:_OPEN_ORDER.index(rec.status)] if rec.status in _OPEN_ORDER else _OPEN_ORDER
    for status in reversed(before):
        if status == "validating" or getattr(rec, f"{status}_at", None):
            return status
    return None


def changed_at(rec: BatchRecord) -> int:
    return int(getattr(rec, f"{rec.status}_at", None) or rec.created_at)


def detail(rec: BatchRecord) -> dict[str, Any]:
    batch = to_wire(rec)
    errors = batch.errors.data if batch.errors is not None else []
    return {
        "version": VERSION,
        "batch_id": rec.pk,
        "status": rec.status,
        "previous_status": previous_status(rec),
        "tenant": rec.tenant,
        "endpoint": rec.endpoint,
        "model": rec.model,
        "input_file_id": rec.input_file_id,
        "output_file_id": rec.output_file_id,
        "error_file_id": rec.error_file_id,
        "request_counts": batch.request_counts.model_dump(),
        "created_at": rec.created_at,
        "changed_at": changed_at(rec),
        "expires_at": rec.expires_at,
        "failure_message": errors[0].message if rec.status == "failed" and errors else None,
        "metadata": rec.metadata,
    }


@dataclass
class StateChanges:
    bus: EventBus

    def put(self, rec: BatchRecord) -> str:
        """EventBridge's event id; raises when the event was not accepted."""
        return self.bus.put(source=SOURCE, detail_type=DETAIL_TYPE, detail=detail(rec), at=changed_at(rec))

    def publish(self, rec: BatchRecord) -> str | None:
        """`put` for an open status, which is never retried: a failure is logged, never raised."""
        try:
            return self.put(rec)
        except Exception:
            log.exception("state-change event %s -> %s not put on %s", rec.pk, rec.status, self.bus.bus,
                          extra={"batch_id": rec.pk})
            return None
