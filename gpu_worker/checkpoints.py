"""Checkpoints: finished result lines made durable in S3, summarized, then counted.

When (CheckpointPolicy): an attempt's first checkpoint comes early (after `checkpoint_every_lines` lines or
`checkpoint_every_seconds`), so results while running show something at once and a resume has a foothold; every
later one when the buffer holds S3's part minimum (5 MiB, so Finalize copies it server-side instead of uploading
its bytes again) or `checkpoint_max_seconds` after the last one; and at once, then at every tick, once the
attempt is stopping (cancel, expiry, SIGTERM) and at its end. The live counters are added at every tick
(`checkpoint_every_seconds`) for the lines finished since, durable or not: they are progress only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass

import msgspec

from gpu_worker.results import ResultLine
from nightbatch.aws import BlobStore, Table
from nightbatch.aws.parts import MIN_PART_BYTES
from nightbatch.aws.records import BatchRecord
from nightbatch.errors import StorageConflictError
from nightbatch.layout import checkpoint_key, progress_key
from nightbatch.results.lines import CheckpointSummary, join_summaries, summarize_checkpoint, write_checkpoint_summary
from nightbatch.settings import WorkerSettings

log = logging.getLogger("gpu_worker.checkpoints")

# The dashboard's chart reads `progress-<attempt>.json` beside the checkpoints: cumulative counts over time,
# thinned to at most this many samples so the object stays small on a long shard.
MAX_SAMPLES = 240
# An attempt's last lines are appended to its previous checkpoint only when that one is at most this big: the
# copy is server-side, but bounded (a copied part may be up to 5 GiB; a checkpoint is usually about 5 MiB).
MAX_JOINED_BYTES = 256 * 1024 * 1024


def thin(samples: list[list[float]]) -> list[list[float]]:
    """Every other sample, always keeping the newest, once there are more than MAX_SAMPLES."""
    if len(samples) <= MAX_SAMPLES:
        return samples
    return samples[-1::-2][::-1]


@dataclass(frozen=True)
class CheckpointPolicy:
    """When a buffer of finished lines becomes a checkpoint (the worker's, and the bench's stand-in workers')."""

    first_lines: int = 64
    first_seconds: float = 10.0
    min_bytes: int = MIN_PART_BYTES
    max_seconds: float = 600.0

    @classmethod
    def from_settings(cls, worker: WorkerSettings) -> CheckpointPolicy:
        return cls(first_lines=max(1, worker.checkpoint_every_lines),
                   first_seconds=max(0.01, worker.checkpoint_every_seconds),
                   min_bytes=worker.checkpoint_bytes or MIN_PART_BYTES,
                   max_seconds=max(0.01, worker.checkpoint_max_seconds))

    def due(self, *, lines: int, nbytes: int, since: float, first: bool) -> bool:
        """Whether `lines` buffered lines of `nbytes` become a checkpoint now; `since`: seconds since the
        attempt's last checkpoint (or its start), `first`: the attempt has written none yet."""
        if not lines:
            return False
        if nbytes >= self.min_bytes:
            return True
        if first:
            return lines >= self.first_lines or since >= self.first_seconds
        return since >= self.max_seconds


class Checkpointer:
    """Buffers result lines and writes them as one new S3 object per checkpoint, from a background task.

    Each checkpoint is one PUT (atomic: a reader sees all of its lines or none), so after a crash every line is
    either durable or never written, and a restarted shard skips exactly the durable ones. Checkpoints are
    written one at a time in seq order while inference goes on.
    """

    def __init__(
        self, *, blobs: BlobStore, table: Table, batch_id: str, prefix: str, attempt: str, next_seq: int,
        policy: CheckpointPolicy,
    ) -> None:
        self.blobs = blobs
        self.table = table
        self.started_at = time.time()
        self.batch_id = batch_id
        self.prefix = prefix
        self.attempt = attempt
        self.seq = next_seq
        self.policy = policy
        self.buffer: list[ResultLine] = []
        self.buffered_bytes = 0
        self.uncounted: list[ResultLine] = []  # finished since the live counters were last added to
        self.written = 0  # lines made durable by this attempt
        self.objects = 0
        self.put_seconds = 0.0
        self.last_checkpoint = time.monotonic()  # or the attempt's start
        self._previous: tuple[str, CheckpointSummary] | None = None  # this attempt's last checkpoint, summarized
        self.samples: list[list[float]] = []  # [unix time, completed, failed, output tokens], cumulative
        self._totals = [0, 0, 0]
        self._wake = asyncio.Event()
        self._stopping = False
        self._closing = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> asyncio.Task[None]:
        self._task = asyncio.create_task(self._run(), name="checkpointer")
        return self._task

    def add(self, line: ResultLine) -> None:
        self.buffer.append(line)
        self.uncounted.append(line)
        self.buffered_bytes += len(line.data)
        if self.buffered_bytes >= self.policy.min_bytes or (
                not self.objects and len(self.buffer) >= self.policy.first_lines):
            self._wake.set()

    def flush_soon(self) -> None:
        """A stop was requested: write what is buffered now, and from then on at every tick."""
        self._stopping = True
        self._wake.set()

    async def close(self) -> None:
        """Writes whatever is buffered and stops; raises if any checkpoint could not be written."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await self._task
        else:
            await self._flush(last=True)
            await self._count_finished()

    def due(self) -> bool:
        return self.policy.due(lines=len(self.buffer), nbytes=self.buffered_bytes,
                               since=time.monotonic() - self.last_checkpoint, first=not self.objects)

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self.policy.first_seconds)
            self._wake.clear()
            closing = self._closing
            if closing or self._stopping or self.due():
                await self._flush(last=closing)
            await self._count_finished()
            if closing:
                return

    async def _flush(self, *, last: bool = False) -> None:
        if not self.buffer:
            return
        lines, self.buffer, self.buffered_bytes = self.buffer, [], 0
        await asyncio.to_thread(self.write, lines, last=last)

    async def _count_finished(self) -> None:
        lines, self.uncounted = self.uncounted, []
        if lines:
            await asyncio.to_thread(self._count, lines)

    def write(self, lines: list[ResultLine], *, last: bool = False) -> None:
        """One checkpoint of `lines` (blocking: the flusher's thread, or a stand-in worker): its PUT, its
        summary, the progress samples. `last`: the attempt's last write (its shard's end, or a stop), whose
        lines, if too few for a part of their own, are appended to the attempt's previous checkpoint
        (`_join`) rather than left for Finalize to upload again."""
        key = checkpoint_key(self.prefix, self.seq, self.attempt)
        numbers: list[int] | None = None
        if all(line.number >= 0 for line in lines):
            # In input order: each checkpoint is then a sorted run Finalize merges for `output_order: "input"`
            # (nightbatch.results.input_order) without holding it; the order of a checkpoint's lines is free.
            lines = sorted(lines, key=lambda line: line.number)
            numbers = [line.number for line in lines]
        data = b"".join(line.data for line in lines)
        summary = self._summarize(data, numbers)
        started = time.monotonic()
        joined = self._join(data, summary) if last else None
        if joined is not None:
            key, summary = joined
        else:
            etag = self.blobs.put_bytes(key, data, content_type="application/jsonl")
            summary = None if summary is None else msgspec.structs.replace(summary, etag=etag)
            self.seq += 1
            self.objects += 1
        self.put_seconds += time.monotonic() - started
        self._previous = None if summary is None else (key, summary)
        if summary is not None:
            self._write_summary(key, summary)
        self.written += len(lines)
        self.last_checkpoint = time.monotonic()
        self._sample(lines)

    def _summarize(self, data: bytes, numbers: list[int] | None) -> CheckpointSummary | None:
        try:
            return summarize_checkpoint(data, etag="", numbers=numbers)
        except Exception:
            log.exception("checkpoint of %s not summarized; Finalize will parse it", self.prefix)
            return None

    def _write_summary(self, key: str, summary: CheckpointSummary) -> None:
        """Writes the checkpoint's summary, so Finalize counts it without parsing it (after the checkpoint: a
        checkpoint whose summary is missing, or is not of its ETag, is parsed instead, never lost)."""
        try:
            write_checkpoint_summary(self.blobs, key, summary)
        except Exception:
            log.exception("summary of %s not written; Finalize will parse the checkpoint", key)

    def _join(self, data: bytes, summary: CheckpointSummary | None) -> tuple[str, CheckpointSummary] | None:
        """`data` appended to this attempt's previous checkpoint (BlobStore.append: that checkpoint copied
        server-side, `data` sent as the last part), when `data` is under S3's part minimum and that checkpoint
        is not: Finalize then copies the whole instead of uploading `data` again. The checkpoint keeps its key
        (its seq), so its lines keep their place in the merge order and the new ones take its place, before
        the attempt's later seqs, of which there are none. None: written as a checkpoint of its own."""
        prev = self._previous
        if (prev is None or summary is None or len(data) >= MIN_PART_BYTES
                or not MIN_PART_BYTES <= prev[1].size <= MAX_JOINED_BYTES):
            return None
        key, head = prev
        try:
            etag = self.blobs.append(key, head.size, data, content_type="application/jsonl")
        except Exception:
            log.exception("last lines not appended to %s; written as a checkpoint of their own", key)
            return None
        return key, join_summaries(head, summary, etag=etag)

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
