"""The batch's cancel/expire flag as a running shard sees it: why, if at all, it must stop taking requests."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from nightbatch.aws import Table
from nightbatch.aws.records import BatchRecord
from nightbatch.wire import TERMINAL_STATUSES

log = logging.getLogger("gpu_worker.watch")

# Stop reasons that come from the batch itself: the shard stopping for them is a clean end, not a failure.
BATCH_REASONS = frozenset(
    {"cancelling", "expired", "batch_missing", "batch_finalizing"} | {f"batch_{s}" for s in TERMINAL_STATUSES}
)


def stop_reason(batch: BatchRecord | None, now: float) -> str | None:
    """None while the batch still wants results; otherwise the reason this shard must stop."""
    if batch is None:
        return "batch_missing"
    status = batch.status
    if status == "cancelling":
        return "cancelling"
    if status == "expired":
        return "expired"
    if status in TERMINAL_STATUSES or status == "finalizing":
        # Finalize runs only after every shard is done or given up on; a shard still running then is a zombie.
        return f"batch_{status}"
    if batch.expires_at is not None and now >= batch.expires_at:
        return "expired"
    return None


async def read_stop_reason(table: Table, batch_id: str) -> str | None:
    batch = await asyncio.to_thread(table.get_record, BatchRecord, batch_id)
    return stop_reason(batch, time.time())


async def watch_batch(table: Table, batch_id: str, *, every: float, halt: asyncio.Event,
                      polled: asyncio.Event | None = None) -> str:
    """Polls the batch item until it says stop (returns the reason) or `halt` is set (returns ""); sets
    `polled` after each read, failed or not."""
    while not halt.is_set():
        try:
            reason = await read_stop_reason(table, batch_id)
        except Exception:
            # A DynamoDB hiccup must not stop inference; the next poll tries again.
            log.exception("could not read batch %s", batch_id)
            reason = None
        if polled is not None:
            polled.set()
        if reason is not None:
            return reason
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(halt.wait(), timeout=every)
    return ""
