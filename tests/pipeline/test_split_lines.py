"""split_lines against the plain definition: numbered lines, CR and first BOM dropped, long lines counted."""

from __future__ import annotations

from hypothesis import given, settings

from nightbatch.jsonl import BOM, RawLine, split_lines
from tests.support.jsonl_bytes import CHUNK_SIZES, MAX_BYTES, PIECES, chunked


def reference(data: bytes, max_bytes: int) -> list[RawLine]:
    at = 0
    if data.startswith(BOM):
        data = data[len(BOM):]
        at = len(BOM)
    pieces = data.split(b"\n")
    if pieces[-1] == b"":
        pieces.pop()
    out = []
    for i, p in enumerate(pieces, 1):
        if len(p) > max_bytes:
            out.append(RawLine(i, None, len(p), at))
        else:
            q = p[:-1] if p.endswith(b"\r") else p
            out.append(RawLine(i, q, len(q), at))
        at += len(p) + 1
    return out


@settings(max_examples=400, deadline=None)
@given(PIECES, CHUNK_SIZES, MAX_BYTES)
def test_split_lines_matches_the_definition(parts: list[bytes], chunk: int, max_bytes: int) -> None:
    data, chunks = chunked(parts, chunk)
    if chunks and len(chunks[0]) < len(BOM) and data.startswith(BOM):
        return  # a BOM split across the first chunks is not recognised (S3 chunks are MiBs)
    assert list(split_lines(chunks, max_bytes=max_bytes)) == reference(data, max_bytes)
