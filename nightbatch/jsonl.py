"""Streaming JSONL: split a byte stream into numbered lines without ever holding more than one line.

JSON on the hot paths goes through msgspec (compiled; picked over orjson by `bench.json_parsers`: as fast to
parse our lines, and it keeps integers beyond 64 bits exact where orjson silently turns them into floats).
Anything msgspec refuses is handed to the standard library, so what we accept and how we report an error
are exactly the standard library's (NaN, Infinity, 1e400, lone surrogates are accepted as before).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import msgspec

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode

BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class RawLine:
    number: int          # 1-based, blank lines counted
    data: bytes | None   # None when the line exceeded max_bytes (its bytes were skipped, not kept)
    size: int            # bytes in the line as uploaded (without the newline)


def split_lines(chunks: Iterable[bytes], *, max_bytes: int) -> Iterator[RawLine]:
    """Yields every line; a trailing CR (CRLF files) and a leading UTF-8 BOM are dropped."""
    buf = bytearray()
    number = 0
    overflow = 0  # bytes of the current line already skipped because it is too long
    first = True
    for chunk in chunks:
        if first and chunk:
            if chunk.startswith(BOM):
                chunk = chunk[len(BOM):]
            first = False
        start = 0
        while True:
            nl = chunk.find(b"\n", start)
            if nl < 0:
                rest = chunk[start:]
                if overflow:
                    overflow += len(rest)
                elif len(buf) + len(rest) > max_bytes:
                    overflow = len(buf) + len(rest)
                    buf.clear()
                else:
                    buf += rest
                break
            piece = chunk[start:nl]
            number += 1
            if overflow or len(buf) + len(piece) > max_bytes:
                yield RawLine(number, None, overflow + len(buf) + len(piece))
            else:
                buf += piece
                if buf.endswith(b"\r"):
                    del buf[-1]
                yield RawLine(number, bytes(buf), len(buf))
            buf.clear()
            overflow = 0
            start = nl + 1
    if buf or overflow:
        number += 1
        if overflow:
            yield RawLine(number, None, overflow)
        else:
            if buf.endswith(b"\r"):
                del buf[-1]
            yield RawLine(number, bytes(buf), len(buf))


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
