"""The lines of a shard: (input line number, estimated tokens, the request's bytes as uploaded), in order.

The one reader of a shard's lines, for the worker (gpu_worker/shard.py) and for a shard of 0.1.x in
Finalize. A version 2 shard points into the input object: its line indexes (shards/index.py: LineIndex) hold
byte ranges, and neighbouring ranges are merged into one read (the bytes between them read and dropped), done
as ranged GETs of at most BLOCK_BYTES each, each read whole: memory holds one block and one line, never the
shard, and no GET stays open while the engine works through a block (the worker consumes its lines over hours).
Every read is of the version Validate accepted (nightbatch/files/inputs.py); where that version can no longer be
read, each line not read yet comes with the failure, named by the index (its number and custom_id), and the
worker ends it with that error. Finalize names the lines that got no result from the index alone (`shard_ids`):
it reads no input. A version 1 shard (planned by 0.1.x) reads its segment copies; that reading, and the reading of
0.1.x's line indexes without ids, may go in 0.3 (docs/ARCHITECTURE.md "Versions of the hand-off records").
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from nightbatch.aws import BlobStore
from nightbatch.files.inputs import INPUT_CHANGED, InputReader, InputUnavailable
from nightbatch.jsonl import UndecodableLine, loads, split_lines
from nightbatch.shards.index import read_line_indexes
from nightbatch.shards.segments import split_segment_line
from nightbatch.shards.spec import ShardSpec
from nightbatch.tenancy.scope import Scope
from nightbatch.validation.line import RequestLine

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
    custom_id: str = ""  # as Validate accepted it (the line index's; "": an index 0.1.x wrote)
    failure: InputUnavailable | None = None  # its input can no longer be read: `raw` is empty


class Run(NamedTuple):
    first: int  # line number of the run's first line
    start: int
    end: int
    est: list[int]  # the segment's estimates (shared by its runs)
    ids: list[str]  # the segment's custom_ids (shared by its runs; empty: an index 0.1.x wrote)
    at: int  # the run's first line in `est` and `ids` (-1: not known, the index has no counts)
    size: int  # its lines (-1: not known)


def shard_lines(blobs: BlobStore, spec: ShardSpec, *, chunk: int = BLOCK_BYTES,
                scope: Scope | None = None) -> Iterator[ShardLine]:
    """`scope`: the shard's tenant, whose objects alone the reader may read (the worker's; files/inputs.py)."""
    if spec.input is None:
        yield from _v1_lines(blobs, spec.segments)
        return
    yield from _read_runs(_Blocks(InputReader(blobs, spec.input, scope=scope), chunk), _runs(blobs, spec.indexes))


def shard_requests(blobs: BlobStore, spec: ShardSpec, *, scope: Scope | None = None) -> Iterator[RequestLine]:
    """shard_lines, each request decoded (its custom_id and body). A line whose input changed since Validate
    accepted it comes with its `failure` (its custom_id the index's): the worker ends it with that error."""
    for line in shard_lines(blobs, spec, scope=scope):
        if line.failure is not None:
            yield RequestLine(line.number, line.custom_id, {}, line.est, failure=line.failure)
            continue
        try:
            req = loads(line.raw)
            custom_id, body = str(req["custom_id"]), req["body"]
            if not isinstance(body, dict):
                raise TypeError(f"body is {type(body).__name__}, not an object")
        except (UndecodableLine, KeyError, TypeError) as e:
            # Validate reads with the same decoder, so only an input read unpinned (an index 0.1.x wrote)
            # lands here.
            if line.custom_id:
                yield _changed(spec, line, "no longer holds the request the batch accepted")
                continue
            log.error("line %d of batch %s cannot be read (%s): it is passed over", line.number, spec.batch_id, e,
                      extra={"batch_id": spec.batch_id})
            continue
        if line.custom_id and custom_id != line.custom_id:
            yield _changed(spec, line, f"holds custom_id {custom_id[:64]!r} at this line, not the one accepted")
            continue
        yield RequestLine(line.number, custom_id, body, line.est)


def _changed(spec: ShardSpec, line: ShardLine, why: str) -> RequestLine:
    failure = InputUnavailable(INPUT_CHANGED, "", f"{why} (it changed after the batch accepted it)")
    return RequestLine(line.number, line.custom_id, {}, line.est, failure=failure)


def shard_ids(blobs: BlobStore, spec: ShardSpec) -> Iterator[tuple[int, str]]:
    """(line number, custom_id) of each line of the shard, in order: from its line indexes, which name every
    line Validate accepted, so no input is read (Finalize's unrun lines, the input order, per-model figures). A
    shard of 0.1.x reads its lines (its segment copies, or its input)."""
    if spec.input is not None:
        indexes = list(read_line_indexes(blobs, spec.indexes))
        if all(index.named() for index in indexes):
            for index in indexes:
                at = 0
                for (first, _, _), count in zip(index.runs, index.counts, strict=True):
                    for j in range(count):
                        yield first + j, index.ids[at + j]
                    at += count
            return
    for req in shard_requests(blobs, spec):
        yield req.number, req.custom_id


def _runs(blobs: BlobStore, refs: list[str]) -> Iterator[Run]:
    """Every run of the shard in order; one LineIndex in memory at a time (and the pack range read with it)."""
    for index in read_line_indexes(blobs, refs):
        named = index.named()
        at = 0
        for i, (first, start, end) in enumerate(index.runs):
            size = index.counts[i] if named else -1
            yield Run(first, start, end, index.est, index.ids if named else [], at if named else -1, size)
            at += size


def _windows(runs: Iterable[Run]) -> Iterator[tuple[int, int, list[Run]]]:
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


def _read_runs(reader: _Blocks, runs: Iterable[Run]) -> Iterator[ShardLine]:
    est_of: list[int] | None = None
    k = 0  # the next estimate of the current segment (an index without counts)
    for lo, hi, group in _windows(runs):
        cursor = _Cursor(reader.read(lo, hi), lo)
        for n, run in enumerate(group):
            if run.est is not est_of:
                est_of, k = run.est, 0
            if run.at >= 0:
                k = run.at
            done = 0
            try:
                cursor.skip_to(run.start)
                number = run.first
                while cursor.pos < run.end:
                    line = cursor.line(run.end).strip()
                    if line:
                        yield ShardLine(number, run.est[k], line, run.ids[k] if run.ids else "")
                        k += 1
                        done += 1
                    number += 1
            except InputUnavailable as failure:
                if run.size < 0:
                    raise  # an index of 0.1.x names no line: the attempt fails, Finalize says why
                # The run's lines not read end with the failure; the window's later runs are read again, each
                # on its own (they may lie in another object, still readable).
                for j in range(done, run.size):
                    yield ShardLine(run.first + j, run.est[run.at + j], b"", run.ids[run.at + j], failure)
                for later in group[n + 1:]:
                    yield from _read_runs(reader, [later])
                break


class _Blocks:
    """Reads of the input (nightbatch/files/inputs.py: at the version accepted) as ranged GETs of at most
    BLOCK_BYTES, each read whole, in `chunk` pieces: no GET stays open while the engine works."""

    def __init__(self, reader: InputReader, chunk: int) -> None:
        self.reader = reader
        self.chunk = chunk

    def read(self, start: int, end: int) -> Iterator[bytes]:
        """The bytes [start, end) of the input, a GET of at most BLOCK_BYTES at a time, in `chunk` pieces."""
        for lo in range(start, end, BLOCK_BYTES):
            for a, b in self.reader.spans(lo, min(end, lo + BLOCK_BYTES)):  # an object's lines before the next's GET
                block = b"".join(self.reader.stream(a, b))
                if len(block) <= self.chunk:
                    yield block
                else:  # tests: lines straddling pieces
                    yield from (block[i:i + self.chunk] for i in range(0, len(block), self.chunk))


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
        # Read unpinned (an index 0.1.x wrote): the object is shorter than when it was indexed.
        raise InputUnavailable(INPUT_CHANGED, "", f"ended at byte {self.pos}, before the range its index names")

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
