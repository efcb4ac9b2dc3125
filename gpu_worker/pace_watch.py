"""The runner's side of the deadline-aware fallback: measures an endpoint attempt's pace and stops the attempt when
the window's slack would run out at it (nightbatch/shards/pace.py's `must_move`), so that Capacity moves the shard's
remaining lines to the model's GPU backend. Writes each reading beside the shard's results for Capacity and the
doctor (every `PACE_WRITE_SECONDS`, and the one that stops the attempt)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from nightbatch.aws import BlobStore, Table
from nightbatch.aws.records import BatchRecord
from nightbatch.clock import now
from nightbatch.settings import Settings
from nightbatch.shards.pace import EndpointPace, must_move, write_pace

log = logging.getLogger("gpu_worker.pace")

PACE_WRITE_SECONDS = 60.0
MOVE_REASON = "endpoint_too_slow"  # the attempt's stop reason


@dataclass(frozen=True)
class PaceJob:
    batch_id: str
    shard_id: str
    attempt: str
    lines: int  # the shard's
    done_before: int  # lines earlier attempts finished


async def watch_pace(job: PaceJob, *, results: Callable[[], int], halt: Callable[[str], None],
                     stopped: asyncio.Event, blobs: BlobStore, table: Table, settings: Settings) -> None:
    """Until `stopped`: every poll, this attempt's results per second over the pace window; `halt(MOVE_REASON)`
    when the shard must move. `results()`: this attempt's results so far."""
    capacity = settings.capacity
    batch = await asyncio.to_thread(table.get_record, BatchRecord, job.batch_id)
    if batch is None or batch.expires_at is None:
        return
    started = time.monotonic()
    samples: deque[tuple[float, int]] = deque([(started, results())])
    written = -PACE_WRITE_SECONDS
    while not stopped.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopped.wait(), timeout=settings.worker.poll_seconds)
        if stopped.is_set():
            return
        t, count = time.monotonic(), results()
        samples.append((t, count))
        while len(samples) > 2 and t - samples[1][0] >= capacity.endpoint_pace_window_seconds:
            samples.popleft()
        first_t, first_count = samples[0]
        pace = EndpointPace(attempt=job.attempt, at=now(), lines=job.lines, done=job.done_before + count,
                            lines_per_second=(count - first_count) / max(1e-9, t - first_t),
                            measured_seconds=t - started, seconds_left=float(batch.expires_at) - now())
        reason = must_move(pace, margin_seconds=capacity.margin_seconds,
                           measure_seconds=capacity.endpoint_measure_seconds)
        if reason is not None:
            pace = pace.model_copy(update={"move": True, "reason": reason})
        if reason is not None or t - written >= PACE_WRITE_SECONDS:
            written = t
            try:
                await asyncio.to_thread(write_pace, blobs, job.batch_id, job.shard_id, pace)
            except Exception:
                log.exception("could not write the pace of %s/%s", job.batch_id, job.shard_id)
                if reason is not None:
                    continue  # Capacity must read why the attempt stopped: try again at the next poll
        if reason is not None:
            log.warning("shard %s/%s moves to its GPU backend: %s", job.batch_id, job.shard_id, reason)
            halt(MOVE_REASON)
            return
