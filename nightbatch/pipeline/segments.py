"""Segment lines: a validated request as uploaded, with its input line number and estimated tokens.

Each line is `{"n": <1-based input line>, "est": <estimated tokens>, "req": <the input line's JSON object>}`;
the request keeps its own bytes, so Validate parses every line once and re-serialises nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nightbatch.jsonl import loads


@dataclass(frozen=True)
class SegmentRequest:
    number: int
    est: int
    custom_id: str
    body: dict[str, Any]


def segment_line(number: int, est: int, raw: bytes) -> bytes:
    return b'{"n":%d,"est":%d,"req":%s}\n' % (number, est, raw.strip())


def parse_segment_line(data: bytes) -> SegmentRequest:
    obj = loads(data)
    req = obj["req"]
    return SegmentRequest(number=int(obj["n"]), est=int(obj["est"]), custom_id=req["custom_id"], body=req["body"])
