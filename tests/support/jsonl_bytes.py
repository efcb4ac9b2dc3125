"""Hypothesis draws of JSONL bytes and the chunks a stream would hand them over in, for the tests of the line
splitters (nightbatch/jsonl.py): CR, CRLF, a BOM anywhere, lines longer than the limit."""

from __future__ import annotations

from hypothesis import strategies as st

from nightbatch.jsonl import BOM

PIECES = st.lists(st.sampled_from([b"a", b"bc", b"\n", b"\r", b"\r\n", b"{}", b"xyzw" * 3, BOM]))
CHUNK_SIZES = st.integers(1, 9)
MAX_BYTES = st.integers(1, 13)


def chunked(parts: list[bytes], chunk: int) -> tuple[bytes, list[bytes]]:
    """The bytes the pieces make, and those bytes in chunks of `chunk`."""
    data = b"".join(parts)
    return data, [data[i:i + chunk] for i in range(0, len(data), chunk)]
