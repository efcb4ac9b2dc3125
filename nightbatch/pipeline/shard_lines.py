"""The lines of a shard: (input line number, estimated tokens, the request's bytes as uploaded), in order.

One reader for the worker (gpu_worker/shard.py) and Finalize (its unrun lines). A version 2 shard points
into the input object: its line indexes (layout.LineIndex) hold byte ranges, and neighbouring ranges are merged
into one read (the bytes between them read and dropped), done as ranged GETs of at most BLOCK_BYTES each, each
read whole: memory holds one block and one line, never the shard, and no GET stays open while the engine works
through a block (the worker consumes its lines over hours). A version 1 shard (planned by the previous release)
reads its segment copies.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import NamedTuple

from nightbatch import layout
from nightbatch.jsonl import UndecodableLine, loads, split_lines
from nightbatch.layout import InputSource, ShardSpec
from nightbatch.pipeline.segments import SegmentRequest, split_segment_line
from nightbatch.storage import BlobStore
from nightbatch.storage.parts import PartStore

log = logging.getLogger("nightbatch.shard_lines")
# Ranges closer than this are read together: a GET costs a round trip (~20-50 ms on S3), which is worth
# ~1 MiB of transfer; prefix-grouped segments are scattered lines, each its own range.
MERGE_GAP_BYTES = 1024 * 1024
BLOCK_BYTES = 8 * 1024 * 1024
V1_MAX_LINE = 64 * 1024 * 1024  # a segment line holds one input line (itself bounded by max_line_bytes)


class ShardLine(NamedTuple):
    number: int
    est: int
    raw: bytes  # the request's bytes as uploaded, surrounding whitespace (and a CR) stripped


class Run(NamedTuple):
    first: int  # line number of the run's first line
    start: int
    end: int
    est: list[int]  # the segment's estimates (shared by its runs)


def shard_lines(blobs: BlobStore, spec: ShardSpec, *, chunk: int = BLOCK_BYTES) -> Iterator[ShardLine]:
    if spec.input is None:
        yield from _v1_lines(blobs, spec.segments)
        return
    yield from _read_runs(InputReader(blobs, spec.input, chunk), _runs(blobs, spec.indexes))


def shard_requests(blobs: BlobStore, spec: ShardSpec) -> Iterator[SegmentRequest]:
    """shard_lines, each request decoded (its custom_id and body)."""
    for line in shard_lines(blobs, spec):
        try:
            req = loads(line.raw)
        except UndecodableLine as e:
            # Validate reads with the same decoder, so only a line a previous release accepted lands here.
            log.error("line %d of batch %s cannot be read (%s): it is passed over", line.number, spec.batch_id, e,
                      extra={"batch_id": spec.batch_id})
            continue
        yield SegmentRequest(number=line.number, est=line.est, custom_id=str(req["custom_id"]), body=req["body"])


def _runs(blobs: BlobStore, refs: list[str]) -> Iterator[Run]:
    """Every run of the shard in order; one LineIndex in memory at a time (and the pack range read with it)."""
    for index in layout.read_line_indexes(blobs, refs):
        for first, start, end in index.runs:
            yield Run(first, start, end, index.est)


def _windows(runs: Iterator[Run]) -> Iterator[tuple[int, int, list[Run]]]:
    """Runs grouped into windows [start, end) read in one go: ascending, gaps under MERGE_GAP_BYTES."""
    group: list[Run] = []
    lo = hi = 0
    for run in runs:
        if group and (run.start < hi or run.start - hi > MERGE_GAP_BYTES):
            yield lo, hi, group
            group = []
        if not group:
            lo = run.start
        group.append(run)
        hi = run.end
    if group:
        yield lo, hi, group


def _read_runs(reader: InputReader, runs: Iterator[Run]) -> Iterator[ShardLine]:
    est_of: list[int] | None = None
    k = 0  # the next estimate of the current segment
    for lo, hi, group in _windows(runs):
        cursor = _Cursor(reader.read(lo, hi), lo)
        for run in group:
            if run.est is not est_of:
                est_of, k = run.est, 0
            cursor.skip_to(run.start)
            number = run.first
            while cursor.pos < run.end:
                line = cursor.line(run.end).strip()
                if line:
                    yield ShardLine(number, run.est[k], line)
                    k += 1
                number += 1


class InputReader:
    """Ranged reads of the input's logical bytes, through its Upload parts while it is not composed, or through
    the objects of a user's bucket it is read from in place."""

    def __init__(self, blobs: BlobStore, source: InputSource, chunk: int) -> None:
        self.blobs = blobs
        self.source = source
        self.chunk = chunk
        self.composed = not source.parts

    def read(self, start: int, end: int) -> Iterator[bytes]:
        """The bytes [start, end) of the input, a GET of at most BLOCK_BYTES at a time, in `chunk` pieces."""
        for lo in range(start, end, BLOCK_BYTES):
            block = b"".join(self._get(lo, min(end, lo + BLOCK_BYTES)))
            if len(block) <= self.chunk:
                yield block
            else:  # tests: lines straddling pieces
                yield from (block[i:i + self.chunk] for i in range(0, len(block), self.chunk))

    def _get(self, start: int, end: int) -> Iterator[bytes]:
        # By listing, not HEAD: the worker may list the input prefix but a HEAD of a missing key answers 403.
        if not self.composed and not self.source.in_place and \
                PartStore(self.blobs).sizes(self.source.key).get(self.source.key) == self.source.bytes:
            self.composed = True  # the parts may be purged from now on
        if self.composed:
            yield from self.blobs.iter_chunks(self.source.key, start=start, end=end)
            return
        at = 0
        for part in self.source.parts:
            lo, hi = max(start, at), min(end, at + part.bytes)
            if lo < hi:
                yield from self.blobs.in_bucket(part.bucket).iter_chunks(part.key, start=lo - at, end=hi - at)
            at += part.bytes


class _Cursor:
    """A position in a stream of chunks that starts at offset `pos`; hands out lines up to a bound."""

    def __init__(self, chunks: Iterator[bytes], pos: int) -> None:
        self.chunks = chunks
        self.buf = b""
        self.off = 0
        self.pos = pos

    def _fill(self) -> None:
        for chunk in self.chunks:
            if chunk:
                self.buf, self.off = chunk, 0
                return
        raise ValueError(f"the input ended at byte {self.pos}, before the range its index names")

    def skip_to(self, target: int) -> None:
        while self.pos < target:
            if self.off == len(self.buf):
                self._fill()
            n = min(len(self.buf) - self.off, target - self.pos)
            self.off += n
            self.pos += n

    def line(self, end: int) -> bytes:
        """The bytes from here to the next newline (consumed, not returned) or to `end`."""
        pieces: list[bytes] = []
        while True:
            if self.off == len(self.buf):
                self._fill()
            limit = min(len(self.buf), self.off + end - self.pos)
            nl = self.buf.find(b"\n", self.off, limit)
            stop = limit if nl < 0 else nl
            pieces.append(self.buf[self.off:stop])
            taken = stop - self.off + (nl >= 0)
            self.off += taken
            self.pos += taken
            if nl >= 0 or self.pos >= end:
                return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def _v1_lines(blobs: BlobStore, keys: list[str]) -> Iterator[ShardLine]:
    for key in keys:
        for raw in split_lines(blobs.iter_chunks(key), max_bytes=V1_MAX_LINE):
            if raw.data and raw.data.strip():
                yield ShardLine(*split_segment_line(raw.data))
