"""The batch lifecycle table: every transition is one conditional write from the expected status."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from nightbatch.aws import Table
from nightbatch.aws.records import BatchRecord
from nightbatch.clock import now
from nightbatch.errors import BatchItemTooLargeError, StorageConflictError, StorageItemTooLargeError
from nightbatch.tenancy.limits import release_queue_usage
from nightbatch.wire import TERMINAL_STATUSES


class StateChangeEvents(Protocol):
    """Where a transition's state-change event is put (notifications/state_changes.py: StateChanges, wired by
    nightbatch.wiring when a bus is configured)."""

    def publish(self, rec: BatchRecord) -> str | None: ...


# (from statuses) -> to; the timestamp field is f"{to}_at".
TRANSITIONS: dict[str, tuple[str, ...]] = {
    "failed": ("validating",),
    "in_progress": ("validating",),
    "cancelling": ("validating", "in_progress"),
    "finalizing": ("in_progress", "validating"),
    "completed": ("finalizing",),
    "expired": ("finalizing",),
    # A cancelled batch writes its files while still `cancelling` (cancel wins over expiry).
    "cancelled": ("cancelling",),
}


def transition(
    table: Table, batch_id: str, to: str, *, extra: Mapping[str, Any] | None = None,
    from_: tuple[str, ...] | None = None, at: int | None = None, events: StateChangeEvents | None = None,
) -> BatchRecord:
    """Moves a batch to `to` if it is in one of the allowed statuses; StorageConflictError otherwise.

    With `events`, an open status's state-change event is put once the write succeeded (never failing it); a
    terminal one is left to the Notify step, which retries it with the other channels."""
    allowed = from_ if from_ is not None else TRANSITIONS[to]
    fields: dict[str, Any] = {"status": to, f"{to}_at": at if at is not None else now()}
    fields.update(extra or {})
    remove: tuple[str, ...] = ()
    if to in TERMINAL_STATUSES:
        remove = ("open_status",)
    else:
        fields["open_status"] = to
    try:
        rec = table.update_record(BatchRecord, batch_id, set_=fields, remove=remove, expect_in={"status": allowed})
    except StorageItemTooLargeError:
        fail_oversized(table, batch_id)
        raise BatchItemTooLargeError(OVERSIZED_MESSAGE.format(batch_id=batch_id)) from None
    if to in TERMINAL_STATUSES:
        # A finished batch gives back its queued requests/tokens and its in-flight slot (per-tenant limits).
        release_queue_usage(table, rec.tenant, batch_id)
    elif events is not None:
        events.publish(rec)
    return rec


OVERSIZED_MESSAGE = ("Batch {batch_id} failed: its stored record grew past DynamoDB's 400 KB item limit, so its "
                     "status can no longer be updated. Its results, if any, are not available; please resubmit.")
# What may grow an item: dropped so the failure itself can be written.
_BULKY = ("options", "errors", "ext", "metadata")
_OPEN = ("validating", "in_progress", "cancelling", "finalizing")


def fail_oversized(table: Table, batch_id: str) -> BatchRecord | None:
    """Terminal for a batch whose item DynamoDB refuses to update (ValidationException): drop the bulky
    attributes, then mark it failed with a clear error. None if it was already terminal."""
    try:
        # Two writes: the first shrinks the item, so the second (the failure) fits whatever filled it.
        table.update_record(BatchRecord, batch_id, remove=_BULKY, expect_in={"status": _OPEN})
        rec = table.update_record(BatchRecord, batch_id, set_={
            "status": "failed", "failed_at": now(), "errors": {"object": "list", "data": [{
                "code": "batch_item_too_large", "line": None, "param": None,
                "message": OVERSIZED_MESSAGE.format(batch_id=batch_id)}]}},
            remove=("open_status",), expect_in={"status": _OPEN})
    except StorageConflictError:
        return None
    release_queue_usage(table, rec.tenant, batch_id)
    return rec
