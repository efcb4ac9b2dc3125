"""Checkpoints: finished result lines made durable in S3 every N lines or T seconds, summarized, then counted."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time

from gpu_worker.results import ResultLine
from nightbatch.errors import StorageConflictError
from nightbatch.layout import checkpoint_key, progress_key, write_checkpoint_summary
from nightbatch.results.lines import summarize_checkpoint
from nightbatch.storage import BlobStore, Table
from nightbatch.storage.records import BatchRecord

log = logging.getLogger("gpu_worker.checkpoints")

# The dashboard's chart reads `progress-<attempt>.json` beside the checkpoints: cumulative counts over time,
# thinned to at most this many samples so the object stays small on a long shard.
MAX_SAMPLES = 240


def thin(samples: list[list[float]]) -> list[list[float]]:
    """Every other sample, always keeping the newest, once there are more than MAX_SAMPLES."""
    if len(samples) <= MAX_SAMPLES:
        return samples
    return samples[-1::-2][::-1]


class Checkpointer:
    """Buffers result lines and writes them as one new S3 object per flush, from a background task.

    Each flush is one PUT (atomic: a reader sees all of its lines or none), so after a crash every line is
    either durable or never written, and a restarted shard skips exactly the durable ones. Flushes run one at
    a time in seq order while inference goes on.
    """

    def __init__(
        self, *, blobs: BlobStore, table: Table, batch_id: str, prefix: str, attempt: str, next_seq: int,
        every_lines: int, every_seconds: float,
    ) -> None:
        self.blobs = blobs
        self.table = table
        self.started_at = time.time()
        self.batch_id = batch_id
        self.prefix = prefix
        self.attempt = attempt
        self.seq = next_seq
        self.every_lines = max(1, every_lines)
        self.every_seconds = max(0.01, every_seconds)
        self.buffer: list[ResultLine] = []
        self.written = 0  # lines made durable by this attempt
        self.objects = 0
        self.put_seconds = 0.0
        self.samples: list[list[float]] = []  # [unix time, completed, failed, output tokens], cumulative
        self._totals = [0, 0, 0]
        self._wake = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> asyncio.Task[None]:
        self._task = asyncio.create_task(self._run(), name="checkpointer")
        return self._task

    def add(self, line: ResultLine) -> None:
        self.buffer.append(line)
        if len(self.buffer) >= self.every_lines:
            self._wake.set()

    def flush_soon(self) -> None:
        """Asks for a flush now rather than at the next cadence point (a stop was requested)."""
        self._wake.set()

    async def close(self) -> None:
        """Writes whatever is buffered and stops; raises if any checkpoint could not be written."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await self._task
        else:
            await self._flush()

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self.every_seconds)
            self._wake.clear()
            closing = self._closing
            await self._flush()
            if closing:
                return

    async def _flush(self) -> None:
        if not self.buffer:
            return
        lines, self.buffer = self.buffer, []
        key = checkpoint_key(self.prefix, self.seq, self.attempt)
        data = b"".join(line.data for line in lines)
        started = time.monotonic()
        etag = await asyncio.to_thread(self.blobs.put_bytes, key, data, content_type="application/jsonl")
        self.put_seconds += time.monotonic() - started
        await asyncio.to_thread(self._summarize, key, data, etag)
        self.seq += 1
        self.objects += 1
        self.written += len(lines)
        await asyncio.to_thread(self._count, lines)
        await asyncio.to_thread(self._sample, lines)

    def _summarize(self, key: str, data: bytes, etag: str) -> None:
        """Writes the checkpoint's summary, so Finalize counts it without parsing it (after the checkpoint: a
        checkpoint whose summary is missing is parsed instead, never lost)."""
        try:
            summary = summarize_checkpoint(data, etag=etag)
            if summary is not None:
                write_checkpoint_summary(self.blobs, key, summary)
        except Exception:
            log.exception("summary of %s not written; Finalize will parse the checkpoint", key)

    def _sample(self, lines: list[ResultLine]) -> None:
        completed = sum(1 for line in lines if line.ok)
        t = self._totals
        t[0], t[1], t[2] = t[0] + completed, t[1] + len(lines) - completed, t[2] + sum(x.output_tokens for x in lines)
        self.samples = thin([*self.samples, [round(time.time(), 3), t[0], t[1], t[2]]])
        record = {"attempt": self.attempt, "samples": self.samples}
        try:
            self.blobs.put_bytes(progress_key(self.prefix, self.attempt), json.dumps(record).encode(),
                                 content_type="application/json")
        except Exception:
            log.exception("progress samples not written for batch %s", self.batch_id)  # a chart, not results

    def _count(self, lines: list[ResultLine]) -> None:
        completed = sum(1 for line in lines if line.ok)
        add = {
            "live_completed": completed,
            "live_failed": len(lines) - completed,
            "live_input_tokens": sum(line.input_tokens for line in lines),
            "live_output_tokens": sum(line.output_tokens for line in lines),
        }
        try:
            self.table.update_attributes(BatchRecord, self.batch_id, add=add,
                                         set_if_absent={"live_since": int(self.started_at)})
        except StorageConflictError:
            log.warning("batch %s is gone; progress counters not updated", self.batch_id)
        except Exception:
            # Counters are progress only (Finalize recounts from the files); a checkpoint is what matters.
            log.exception("progress counters not updated for batch %s", self.batch_id)
