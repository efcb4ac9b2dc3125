"""Writers of the formats only 0.1.x wrote, so that tests can prove their readers still read them: the
product writes none of these (docs/ARCHITECTURE.md, "Versions of the hand-off records").

nightbatch 0.1.x wrote version 1 shards, whose segments were copies of the lines (`segment_line`, at
`segment_key`), and line indexes as objects of their own (`write_line_index`, at `line_index_key`) before
Validate packed them. These writers go with the readers they feed, in 0.3.
"""

from __future__ import annotations

from nightbatch import layout
from nightbatch.aws import BlobStore
from nightbatch.shards.index import LineIndex, read_line_indexes


def segment_key(batch_id: str, n: int) -> str:
    """Where 0.1.x wrote a version 1 segment (a copy of its lines)."""
    return f"{layout.segments_prefix(batch_id)}{n:06d}.jsonl"


def line_index_key(batch_id: str, n: int) -> str:
    """Where 0.1.x wrote a segment's LineIndex as an object of its own (now: a range of a pack)."""
    return f"{layout.segments_prefix(batch_id)}{n:06d}.idx.json"


def segment_line(number: int, est: int, raw: bytes) -> bytes:
    """A line of a version 1 segment, as 0.1.x wrote it (read by nightbatch/shards/segments.py)."""
    return b'{"n":%d,"est":%d,"req":%s}\n' % (number, est, raw.strip())


def write_line_index(blobs: BlobStore, key: str, index: LineIndex) -> None:
    """A LineIndex as an object of its own, as 0.1.x wrote it."""
    blobs.put_bytes(key, index.model_dump_json().encode(), content_type="application/json")


def read_line_index(blobs: BlobStore, ref: str) -> LineIndex:
    """The one LineIndex a segment references (a range of a pack, or an object of its own)."""
    return next(read_line_indexes(blobs, [ref]))
