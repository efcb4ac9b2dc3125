"""Validate's block path against its line path: split_blocks' blocks read as block_lines are split_lines'
lines, and IndexWriter.add_block writes the segments and runs that `add` of each line writes."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings

from nightbatch.aws import Adapters
from nightbatch.files.sources import InputSource
from nightbatch.jsonl import LineBlock, block_lines, split_blocks, split_lines
from nightbatch.shards.packs import IndexWriter
from tests.support.jsonl_bytes import CHUNK_SIZES, MAX_BYTES, PIECES, chunked
from tests.support.older_formats import read_line_index


@settings(max_examples=400, deadline=None)
@given(PIECES, CHUNK_SIZES, MAX_BYTES)
def test_blocks_read_line_by_line_are_split_lines(parts: list[bytes], chunk: int, max_bytes: int) -> None:
    _, chunks = chunked(parts, chunk)
    lines = []
    for item in split_blocks(chunks, max_bytes=max_bytes):
        if isinstance(item, LineBlock):
            assert item.cr or not any(line.endswith(b"\r") for line in item.lines)
            lines += block_lines(item, max_bytes)
        else:
            lines.append(item)
    assert lines == list(split_lines(chunks, max_bytes=max_bytes))


def _written(adapters: Adapters, writer: IndexWriter) -> list[Any]:
    writer.close(InputSource(key="files/x", bytes=0))  # sends the last pack, waits for the PUTs
    return [(e.lines, e.est, e.group, e.bytes, e.model, read_line_index(adapters.blobs, e.key))
            for e in writer.index]


@pytest.mark.parametrize("seed", range(12))
def test_add_block_writes_what_add_writes(adapters: Adapters, seed: int) -> None:
    rng = random.Random(seed)
    max_lines, max_bytes = rng.choice([1, 2, 3, 7, 50]), rng.choice([1, 5, 40, 200, 10_000])
    line_by_line = IndexWriter(adapters.blobs, f"b{seed}-lines", max_lines, max_bytes)
    blocks = IndexWriter(adapters.blobs, f"b{seed}-blocks", max_lines, max_bytes)
    number, offset = 1, 0
    for _ in range(rng.randint(1, 12)):
        if rng.random() < 0.3:  # a line of another group or model between blocks, or a blank line
            group, model = rng.choice([(0, "other"), (3, "m"), (None, "")])
            size = rng.randint(0, 30)
            if group is not None:
                line_by_line.add(number, offset, size, 9, group, model, f"id-{number}")
                blocks.add(number, offset, size, 9, group, model, f"id-{number}")
            number, offset = number + 1, offset + size + 1
            continue
        sizes = [rng.randint(1, 30) for _ in range(rng.randint(1, 40))]
        est = [rng.randint(1, 99) for _ in sizes]
        blocks.add_block(number, offset, sizes, est, "m", [f"id-{number + i}" for i in range(len(sizes))])
        for size, e in zip(sizes, est, strict=True):
            line_by_line.add(number, offset, size, e, 0, "m", f"id-{number}")
            number, offset = number + 1, offset + size + 1
    for writer in (line_by_line, blocks):
        for slot in sorted(writer.open):
            writer.flush(slot)
    assert _written(adapters, blocks) == _written(adapters, line_by_line)
