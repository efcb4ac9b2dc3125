"""Validate's hand-off to Plan and the worker: the segment index (layout.segment_index_key) and each segment's
line index, a JSON line of a pack (layout.line_index_pack_key), written by shards/packs.py and read by Plan, the
worker (shards/lines.py) and Finalize. The version 1 form, segments that were copies of the lines, is read by
shards/segments.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, TypeAdapter

from nightbatch.files.sources import InputSource
from nightbatch.layout import segment_index_key

if TYPE_CHECKING:  # the records are read without the AWS adapters
    from nightbatch.aws import BlobStore as Blobs


class SegmentEntry(BaseModel):
    """One segment Validate wrote: its key, how many lines, their estimated tokens (Plan groups by these).

    Version 2 (`bytes` > 0 or in an index with `input`): `key` references its LineIndex, a range of a pack
    (`packed_ref`) or an object of its own; version 1: a copy of the lines."""

    key: str
    lines: int
    est: int
    group: int = 0  # prefix group (nightbatch/pipeline/prefixes.py); 0: lines in input order
    bytes: int = 0  # input bytes the segment's ranges span (version 2)
    model: str = ""  # the lines' `body.model` (a served model or a LoRA adapter); "": the batch's model


class SegmentIndex(BaseModel):
    """The segment index (layout.segment_index_key). Version 2: the input and the segments (LineIndex keys).
    Version 1 was a bare JSON list of SegmentEntry whose keys were copies of the lines; `read_segments` reads
    both."""

    version: int = 2
    input: InputSource | None = None  # None: version 1
    segments: list[SegmentEntry] = []


class LineIndex(BaseModel):
    """A segment's lines as references into the input (version 2): `runs` of [first line number, start, end)
    byte ranges of the input, each a stretch of consecutive input lines of this segment (blank lines inside
    a run are skipped by the reader, as Validate skipped them), and `est`, the estimated tokens of each
    non-blank line in run order. The reader: nightbatch/shards/lines.py.

    `ids` (each line's custom_id, in run order) and `counts` (each run's lines) are what Validate accepted, so
    a line is named, and ended, without its input: by Finalize when it got no result, by the worker when its
    input changed since (nightbatch/files/inputs.py). A run that has them holds no blank line and lies in one
    object of an in-place input, so its lines are numbered `first` to `first + count - 1`. An index 0.1.x
    wrote may have neither."""

    version: Literal[2] = 2
    runs: list[tuple[int, int, int]]
    est: list[int]
    ids: list[str] = []
    counts: list[int] = []

    def named(self) -> bool:
        return len(self.ids) == len(self.est) and len(self.counts) == len(self.runs)


_SEGMENTS = TypeAdapter(list[SegmentEntry])


def packed_ref(key: str, start: int, end: int) -> str:
    """A segment's reference to its LineIndex, the bytes [start, end) of the pack object `key` (a key of ours never
    holds '#'); a reference without '#' is an object of its own (line_index_key, or a version 1 segment)."""
    return f"{key}#{start}-{end}"


def split_ref(ref: str) -> tuple[str, int, int] | None:
    """(pack key, start, end) of a `packed_ref`; None for an object of its own."""
    key, sep, span = ref.partition("#")
    if not sep:
        return None
    start, _, end = span.partition("-")
    return key, int(start), int(end)


def write_segment_index(blobs: Blobs, batch_id: str, index: SegmentIndex) -> None:
    blobs.put_bytes(segment_index_key(batch_id), index.model_dump_json().encode())


def read_segments(blobs: Blobs, batch_id: str) -> SegmentIndex:
    raw = blobs.get_bytes(segment_index_key(batch_id))
    if not raw:
        return SegmentIndex()
    if raw.lstrip()[:1] == b"[":  # version 1, a bare list: 0.1.x's (reading it may go in 0.3)
        return SegmentIndex(version=1, segments=_SEGMENTS.validate_json(raw))
    return SegmentIndex.model_validate_json(raw)


def line_index_line(index: LineIndex) -> bytes:
    """A LineIndex as a line of a pack (line_index_pack_key)."""
    return index.model_dump_json().encode() + b"\n"


def write_line_index_pack(blobs: Blobs, key: str, data: bytes) -> None:
    blobs.put_bytes(key, data, content_type="application/jsonl")


def read_line_indexes(blobs: Blobs, refs: Iterable[str], *, max_read: int = 8 * 1024 * 1024) -> Iterator[LineIndex]:
    """The LineIndexes of `refs`, in order: neighbouring ranges of one pack (a shard's segments, mostly) read in
    one GET of up to `max_read` bytes, one LineIndex decoded at a time."""
    todo = iter(refs)
    ref = next(todo, None)
    while ref is not None:
        packed = split_ref(ref)
        if packed is None:
            raw = blobs.get_bytes(ref)
            if raw is None:
                raise FileNotFoundError(f"line index s3://{blobs.bucket}/{ref} does not exist")
            yield LineIndex.model_validate_json(raw)
            ref = next(todo, None)
            continue
        key, lo, hi = packed
        spans = [(lo, hi)]
        ref = next(todo, None)
        while ref is not None and (nxt := split_ref(ref)) is not None and nxt[0] == key and nxt[1] == hi and (
                nxt[2] - lo <= max_read):
            hi = nxt[2]
            spans.append((nxt[1], hi))
            ref = next(todo, None)
        data = blobs.get_range(key, lo, hi)
        if len(data) != hi - lo:
            raise ValueError(f"line index pack s3://{blobs.bucket}/{key} ends before byte {hi}")
        for start, end in spans:
            yield LineIndex.model_validate_json(data[start - lo:end - lo])


