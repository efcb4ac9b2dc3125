"""Segment lines, the version 1 form of a shard's lines (0.1.x copied the input into them).

Each line is `{"n": <1-based input line>, "est": <estimated tokens>, "req": <the input line's JSON object>}`,
the request kept as its own bytes. Version 2 shards point into the input instead (shards/index.py: LineIndex);
a shard planned by 0.1.x is still read this way (shards/lines.py). This module may go in 0.3, once no batch planned by
0.1.x can still be running (docs/ARCHITECTURE.md "Versions of the hand-off records").
"""

from __future__ import annotations

_REQ = b',"req":'


def split_segment_line(data: bytes) -> tuple[int, int, bytes]:
    """(number, est, the request's bytes) of a segment line, its request sliced out rather than re-serialised."""
    cut = data.index(_REQ)
    n, est = data[len(b'{"n":'):cut].split(b',"est":')
    return int(n), int(est), data[cut + len(_REQ):data.rindex(b"}")].strip()
