"""Results while a batch runs: the result lines its shards' checkpoints hold, as Finalize will merge them.

Shards in Finalize's order, each shard's checkpoints in Finalize's order (`planned_shards`,
`checkpoints_in_order`), the first line of a custom_id wins and later ones (a zombie or re-run attempt's) are
dropped: the lines served are the ones Finalize will put in the files, with the same bytes. A restarted attempt
starts at the seq after every checkpoint it found, so checkpoints only ever join the end of that order and a
line served once keeps its body. Streamed checkpoint by checkpoint; the only state is one shard's set of
custom_id digests. Once the batch has ended, its output or error file is served instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from nightbatch.aws import BlobStore
from nightbatch.aws.records import BatchRecord, FileRecord
from nightbatch.errors import check_supported
from nightbatch.results.precedence import Checkpoint, checkpoints_in_order, first_results, planned_shards
from nightbatch.wire import TERMINAL_STATUSES
from nightbatch.wiring import Services

KINDS = ("output", "error")


@dataclass
class PartialResults:
    """What GET /v1/nightbatch/batches/{id}/results answers: headers first, then the lines.

    `count`: with `complete`, the exact number of lines of the file; before, the batch's live counter of
    finished lines of that kind when the read began: the workers add to it every few seconds for the lines they
    finished, checkpointed yet or not, so it may run ahead of the lines streamed by up to a checkpoint's worth.
    `truncated`: the read stopped, at a line's end, at the deployment's inline response limit (AWS: a Lambda
    response); the rest comes once the batch has ended."""

    batch_id: str
    status: str
    kind: str
    complete: bool
    count: int
    truncated: bool = False
    file: FileRecord | None = None  # complete: the file to serve (None: the batch has no such file)
    lines: Iterator[bytes] = field(default_factory=lambda: iter(()))

    def headers(self) -> dict[str, str]:
        return {
            "x-nightbatch-complete": "true" if self.complete else "false",
            "x-nightbatch-count": str(self.count),
            "x-nightbatch-status": self.status,
            "x-nightbatch-truncated": "true" if self.truncated else "false",
            "cache-control": "no-store",
        }


def partial_results(services: Services, tenant: str, batch_id: str, kind: str, *,
                    scan_bytes: int | None = None) -> PartialResults:
    """`scan_bytes`: stop after reading that much of the checkpoints (a preview's bounded read)."""
    check_supported(kind, KINDS, param="kind")
    batch = services.batches.item(tenant, batch_id)  # another tenant's batch: 404, as a missing one
    ok = kind == "output"
    if batch.status in TERMINAL_STATUSES:
        file_id = batch.output_file_id if ok else batch.error_file_id
        counts = batch.request_counts
        return PartialResults(batch_id, batch.status, kind, True, counts.get("completed" if ok else "failed", 0),
                              file=services.files.item(tenant, file_id) if file_id else None)
    blobs = services.adapters.blobs
    checkpoints = _checkpoints(blobs, batch)
    truncated = False
    settings = services.settings
    limit = settings.files.max_inline_download_bytes
    if settings.deployment.mode != "local" and limit > 0:
        # The response is buffered whole in Lambda: the whole lines of the first `limit` bytes of the checkpoints
        # (dedup only drops bytes), not whole checkpoints: a checkpoint is usually 5 MiB, over the limit.
        truncated = sum(cp.size for _, cps in checkpoints for cp in cps) > limit
        scan_bytes = limit if scan_bytes is None else min(scan_bytes, limit)
    count = (batch.live_completed if ok else batch.live_failed) or 0
    return PartialResults(batch_id, batch.status, kind, False, count, truncated=truncated,
                          lines=_lines(blobs, checkpoints, ok, scan_bytes))


def _checkpoints(blobs: BlobStore, batch: BatchRecord) -> list[tuple[str, list[Checkpoint]]]:
    """(shard_id, its checkpoints) per shard: keys and sizes only, listed before the first line is sent."""
    return [(shard.shard_id, checkpoints_in_order(blobs, batch.pk, shard.shard_id))
            for shard in planned_shards(blobs, batch.pk) if shard.shard_id is not None]


def _lines(blobs: BlobStore, shards: list[tuple[str, list[Checkpoint]]], ok: bool,
           scan_bytes: int | None) -> Iterator[bytes]:
    scanned = 0
    for _shard_id, checkpoints in shards:
        seen: set[int] = set()  # per shard, as Finalize keeps it: a custom_id belongs to one shard
        for cp in checkpoints:
            for result in first_results(blobs, cp.key, seen):
                if scan_bytes is not None and scanned + result.end > scan_bytes:
                    return
                if result.summary.ok == ok:
                    yield result.data + b"\n"
            scanned += cp.size
