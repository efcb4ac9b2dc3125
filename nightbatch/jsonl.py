"""Streaming JSONL: split a byte stream into numbered lines without ever holding more than one line.

JSON on the hot paths goes through msgspec (compiled; picked over orjson by `bench.json_parsers`: as fast to
parse our lines, and it keeps integers beyond 64 bits exact where orjson silently turns them into floats).
Anything msgspec refuses is handed to the standard library, so what we accept and how we report an error
are exactly the standard library's (NaN, Infinity, 1e400, lone surrogates are accepted as before).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import msgspec

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode

BOM = b"\xef\xbb\xbf"


class RawLine(NamedTuple):
    number: int          # 1-based, blank lines counted
    data: bytes | None   # None when the line exceeded max_bytes (its bytes were skipped, not kept)
    size: int            # bytes in the line as uploaded (without the newline)
    offset: int = 0      # where the line starts in the stream (a leading BOM counted): shards point here


def split_lines(chunks: Iterable[bytes], *, max_bytes: int) -> Iterator[RawLine]:
    """Yields every line; a trailing CR (CRLF files) and a leading UTF-8 BOM are dropped.

    Each chunk is split in C (`bytes.split`); only the line that straddles two chunks is carried, and never
    more than `max_bytes` of it (a longer line is counted, not kept)."""
    head = bytearray()  # the unfinished line carried from earlier chunks
    head_at = 0         # its offset
    overflow = 0        # bytes of that line already skipped because it is too long
    number = 0
    base = 0            # the offset of the chunk's first byte
    first = True
    for chunk in chunks:
        if not chunk:
            continue
        if first:
            if chunk.startswith(BOM):
                chunk = chunk[len(BOM):]
                base = len(BOM)
            first = False
        parts = chunk.split(b"\n")
        tail = parts.pop()
        start = 0
        at = base
        if parts and (head or overflow):
            number += 1
            yield _joined(number, head, parts[0], overflow, max_bytes, head_at)
            head = bytearray()
            overflow = 0
            start = 1
            at += len(parts[0]) + 1
        for i in range(start, len(parts)):
            piece = parts[i]
            number += 1
            n = len(piece)
            if n > max_bytes:
                yield RawLine(number, None, n, at)
            elif n and piece[-1] == 13:  # b"\r"
                yield RawLine(number, piece[:-1], n - 1, at)
            else:
                yield RawLine(number, piece, n, at)
            at += n + 1
        base += len(chunk)
        if parts or not (head or overflow):
            head_at = at
        if overflow:
            overflow += len(tail)
        elif len(head) + len(tail) > max_bytes:
            overflow = len(head) + len(tail)
            head.clear()
        else:
            head += tail
    if head or overflow:
        yield _joined(number + 1, head, b"", overflow, max_bytes, head_at)


def _joined(number: int, head: bytearray, piece: bytes, overflow: int, max_bytes: int, at: int) -> RawLine:
    if overflow or len(head) + len(piece) > max_bytes:
        return RawLine(number, None, overflow + len(head) + len(piece), at)
    data = bytes(head) + piece
    if data.endswith(b"\r"):
        data = data[:-1]
    return RawLine(number, data, len(data), at)


def loads(data: bytes | str) -> Any:
    """`json.loads` semantics (same values, same errors), at compiled speed for everything msgspec parses."""
    try:
        return _decode(data)
    except msgspec.MsgspecError:
        return json.loads(data)


def dumps(obj: object) -> bytes:
    """Compact UTF-8 JSON (`ensure_ascii=False`); NaN and infinities are written as null (valid JSON)."""
    try:
        return _encode(obj)
    except TypeError:  # a type msgspec doesn't know: the standard library decides (and raises the same way)
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def dumps_line(obj: object) -> bytes:
    """Compact JSON plus `\\n`, the form of every line we write."""
    return dumps(obj) + b"\n"
