"""Streaming JSONL: split a byte stream into numbered lines without ever holding more than one line.

The decoder of a line, request or result, is `loads`: msgspec's (compiled; picked over orjson by
`bench.json_parsers`: as fast to parse our lines, and it keeps integers beyond 64 bits exact where orjson
silently turns them into floats). Validate, the worker's shard reader, Finalize's general path, the Message
Batch results and retry read a line through it; the two typed fast paths are msgspec decoders too and hand a
line that is not of their shape to it (Validate's plain lines, validation/lines.py: `_line_decoder`; result
lines' custom_id, success and usage, results/lines.py: `summarize_result_line`), so a line one of them accepts
the others read alike. What `loads` refuses includes what the standard library would take but no line can
carry: NaN and Infinity (not JSON; OpenAI refuses them), numbers beyond a double or msgspec's integers, and lone
UTF-16 surrogate escapes (`"\\ud800"`: no UTF-8 output can echo them). The standard library only words the
refusal here; elsewhere it reads only what is not a batch line (the dashboard's previews of lines already
accepted, records, state files).
"""

from __future__ import annotations

import itertools
import json
import math
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


class LineBlock(NamedTuple):
    """Consecutive lines wholly inside one chunk, as uploaded (not yet checked against max_bytes, a trailing CR
    kept): a reader that handles a whole block at C speed takes it so, any other reads its RawLines."""

    number: int          # the first line's
    offset: int          # where the first line starts
    lines: list[bytes]
    cr: bool             # a CR somewhere in the chunk: a line may end with one (CRLF)


def split_lines(chunks: Iterable[bytes], *, max_bytes: int) -> Iterator[RawLine]:
    """Yields every line; a trailing CR (CRLF files) and a leading UTF-8 BOM are dropped.

    Each chunk is split in C (`bytes.split`); only the line that straddles two chunks is carried, and never
    more than `max_bytes` of it (a longer line is counted, not kept)."""
    return lines_of(split_blocks(chunks, max_bytes=max_bytes), max_bytes)


def lines_of(items: Iterable[RawLine | LineBlock], max_bytes: int) -> Iterator[RawLine]:
    """split_blocks' items, line by line."""
    for item in items:
        if isinstance(item, LineBlock):
            yield from block_lines(item, max_bytes)
        else:
            yield item


def block_lines(block: LineBlock, max_bytes: int) -> Iterator[RawLine]:
    """The RawLines of a block, as split_lines yields them."""
    number, at = block.number, block.offset
    for piece in block.lines:
        n = len(piece)
        if n > max_bytes:
            yield RawLine(number, None, n, at)
        elif n and piece[-1] == 13:  # b"\r"
            yield RawLine(number, piece[:-1], n - 1, at)
        else:
            yield RawLine(number, piece, n, at)
        at += n + 1
        number += 1


def split_blocks(chunks: Iterable[bytes], *, max_bytes: int) -> Iterator[RawLine | LineBlock]:
    """split_lines' lines, those of one chunk as a LineBlock, those that straddle chunks (and the last, without
    a newline) as RawLines."""
    head = bytearray()  # the unfinished line carried from earlier chunks
    head_at = 0         # its offset
    overflow = 0        # bytes of that line already skipped because it is too long
    number = 0
    chunks, base = _without_bom(chunks)  # base: the offset of the chunk's first byte
    for chunk in chunks:
        if not chunk:
            continue
        parts = chunk.split(b"\n")
        tail = parts.pop()
        at = base
        if parts and (head or overflow):
            number += 1
            yield _joined(number, head, parts[0], overflow, max_bytes, head_at)
            head = bytearray()
            overflow = 0
            at += len(parts[0]) + 1
            del parts[0]
        if parts:
            yield LineBlock(number + 1, at, parts, b"\r" in chunk)
            number += len(parts)
        base += len(chunk)
        if parts or not (head or overflow):
            head_at = base - len(tail)
        if overflow:
            overflow += len(tail)
        elif len(head) + len(tail) > max_bytes:
            overflow = len(head) + len(tail)
            head.clear()
        else:
            head += tail
    if head or overflow:
        yield _joined(number + 1, head, b"", overflow, max_bytes, head_at)


def _without_bom(chunks: Iterable[bytes]) -> tuple[Iterator[bytes], int]:
    """The chunks without a leading BOM, however the first bytes are cut (an Upload's first part may be one
    byte), and where the first remaining byte sits."""
    it = iter(chunks)
    head = b""
    for chunk in it:
        head += chunk
        if len(head) >= len(BOM):
            break
    if head.startswith(BOM):
        return itertools.chain((head[len(BOM):],), it), len(BOM)
    return itertools.chain((head,), it), 0


def _joined(number: int, head: bytearray, piece: bytes, overflow: int, max_bytes: int, at: int) -> RawLine:
    if overflow or len(head) + len(piece) > max_bytes:
        return RawLine(number, None, overflow + len(head) + len(piece), at)
    data = bytes(head) + piece
    if data.endswith(b"\r"):
        data = data[:-1]
    return RawLine(number, data, len(data), at)


TOO_DEEP = "This line nests JSON too deeply to be parsed."
NOT_JSON = "This line is not parseable as valid JSON."


class UndecodableLine(ValueError):
    """A line `loads` refuses: `code` is `invalid_encoding` or `invalid_json_line`, `message` says why."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def loads(data: bytes | str) -> Any:
    """The line decoder (module docstring); UndecodableLine, with a message fit for a user, when it refuses."""
    try:
        return _decode(data)
    except msgspec.MsgspecError:
        raise _refusal(data) from None
    except RecursionError:
        # `[[[[…` a few thousand deep: one bad line rather than a crashed step.
        raise UndecodableLine("invalid_json_line", TOO_DEEP) from None


class _NonFinite(ValueError):
    pass


def _no_constant(name: str) -> Any:
    raise _NonFinite(name)


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _NonFinite(text)
    return value


def _refusal(data: bytes | str) -> UndecodableLine:
    """Why msgspec refused `data`, in the standard library's words where it has them."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as e:
            return UndecodableLine("invalid_encoding", f"This line is not valid UTF-8 (byte {e.start}).")
    try:
        value = json.loads(data, parse_constant=_no_constant, parse_float=_finite)
    except _NonFinite as e:
        return UndecodableLine("invalid_json_line", f"This line holds the number {e}, which JSON cannot carry "
                               "(NaN, Infinity and numbers beyond a double are not JSON values).")
    except ValueError:
        return UndecodableLine("invalid_json_line", NOT_JSON)
    except RecursionError:
        return UndecodableLine("invalid_json_line", TOO_DEEP)
    if _lone_surrogate(value):
        return UndecodableLine("invalid_encoding", "This line holds a lone UTF-16 surrogate escape (such as "
                               "\\ud800 without its pair): no UTF-8 text can hold it.")
    return UndecodableLine("invalid_json_line", "This line holds a value that cannot be carried (an integer "
                           "beyond 2^64 in magnitude or a string too long).")


def _lone_surrogate(value: Any) -> bool:
    todo = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, str):
            if not v.isascii():
                try:
                    v.encode("utf-8")
                except UnicodeEncodeError:
                    return True
        elif isinstance(v, dict):
            todo.extend(v.keys())
            todo.extend(v.values())
        elif isinstance(v, list):
            todo.extend(v)
    return False


def dumps_carried(obj: object) -> bytes:
    """`dumps` of a value a lenient parser made (the standard library's, which reads the API's request bodies),
    refused as `loads` refuses the line it would be: UndecodableLine for NaN, an infinity (`1e400` parses as one)
    or a lone surrogate, which `dumps` would write as null or fail on. The standard library writes them as it
    read them (NaN, Infinity, the surrogate itself), so `loads` sees what was sent."""
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    try:
        data = text.encode()
    except UnicodeEncodeError:
        raise _refusal(text) from None
    loads(data)
    return data


def dumps(obj: object) -> bytes:
    """Compact UTF-8 JSON (`ensure_ascii=False`); NaN and infinities are written as null (valid JSON)."""
    try:
        return _encode(obj)
    except TypeError:  # a type msgspec doesn't know: the standard library decides (and raises the same way)
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
