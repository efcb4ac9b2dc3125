"""Finalize composes the output file from ranges of the checkpoint objects (S3 copies parts of >= 5 MiB):
same lines as reading them through, first result per custom_id wins, and a re-run writes the same file."""

from __future__ import annotations

import json
import random
from typing import Any
from unittest import mock

import pytest
from botocore.exceptions import ClientError
from hypothesis import given, settings
from hypothesis import strategies as st

from nightbatch import layout
from nightbatch.ids import batch_request_id
from nightbatch.jsonl import dumps_line
from nightbatch.pipeline import BatchTaskInput, finalize, finalize_batch, plan_batch, validate_batch
from nightbatch.pipeline.compose import MIN_PART_BYTES, PartComposer
from nightbatch.pipeline.results import Tally, tally_plain_lines
from nightbatch.services import Services
from tests.workflow.conftest import chat_line, jsonl, make_batch, shard_requests_of

PAD = "x" * 30_000  # ~30 KB per result line: a few hundred lines pass S3's 5 MiB part floor


def result(batch_id: str, custom_id: str, status: int, attempt: str = "a") -> bytes:
    body: dict[str, Any] = (
        {"object": "chat.completion", "choices": [{"message": {"content": PAD + attempt}}],
         "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}
        if status == 200 else {"error": {"message": "bad", "type": "BadRequestError", "param": None, "code": 400}})
    return dumps_line({"id": batch_request_id(batch_id, custom_id), "custom_id": custom_id,
                       "response": {"status_code": status, "request_id": f"req_{custom_id}", "body": body},
                       "error": None})


def test_composer_copies_big_ranges_and_merges_small_ones(services: Services) -> None:
    blobs = services.adapters.blobs
    big = bytes(range(256)) * (6 * 1024 * 1024 // 256)
    blobs.put_bytes("src/big", big)
    c = PartComposer(blobs, "dst")
    c.add_bytes(b"head\n")
    c.add_range("src/big", 0, big)          # topped-up merged part, then a server-side copy
    c.add_range("src/big", 10, big[10:20])  # too small: merged
    c.add_range("src/big", 0, big)          # merged tail >= 5 MiB? no: 10 bytes pending, topped up again
    assert c.close() == 5 + 2 * len(big) + 10
    assert blobs.get_bytes("dst") == b"head\n" + big + big[10:20] + big
    assert c.copied >= 2 * (len(big) - MIN_PART_BYTES)
    small = PartComposer(blobs, "dst-small")
    small.add_range("src/big", 0, big[:100])
    assert small.close() == 100 and blobs.get_bytes("dst-small") == big[:100]
    assert PartComposer(blobs, "dst-empty").close() == 0 and blobs.get_bytes("dst-empty") is None


def test_finalize_rerun_writes_the_same_files(services: Services) -> None:
    services.settings.pipeline.segment_max_lines = 300
    services.settings.pipeline.shard_target_tokens = 2_000  # a few shards
    n = 900
    batch_id = make_batch(services, jsonl([chat_line(i) for i in range(n)]))
    inp = BatchTaskInput(batch_id=batch_id)
    assert validate_batch(inp, services).valid
    blobs = services.adapters.blobs
    items = json.loads(blobs.get_bytes(plan_batch(inp, services).manifest_key) or b"[]")
    assert len(items) > 1
    expected_ok: list[bytes] = []
    expected_err: list[bytes] = []
    for item in items:
        ids = [r.custom_id for r in shard_requests_of(services, batch_id, item["shard_id"])]
        objects: list[list[bytes]] = [[], [], []]
        for j, cid in enumerate(ids):
            line = result(batch_id, cid, 400 if j % 97 == 5 else 200)
            # Most lines in one big checkpoint, the rest in small ones; a zombie re-run repeats a few.
            objects[0 if j < len(ids) * 0.8 else 1 + j % 2].append(line)
            (expected_ok if j % 97 != 5 else expected_err).append(line)
        objects[2][:0] = [result(batch_id, ids[0], 200, attempt="zombie")]  # read after object 0: loses
        objects[1].append(objects[1][0].rstrip(b"\n") + b"\r\n")  # a CRLF duplicate: loses too
        objects[1][1] = objects[1][1].rstrip(b"\n") + b"\r\n"  # CRLF: written without the CR
        prefix = layout.results_prefix(batch_id, item["shard_id"])
        for k, lines in enumerate(objects):
            blobs.put_bytes(f"{prefix}{k:06d}-a.jsonl", b"".join(lines))
        blobs.put_bytes(layout.done_key(batch_id, item["shard_id"]), b"{}")
    assert finalize_batch(inp, services).status == "completed"
    out1 = blobs.get_bytes(layout.output_key(batch_id))
    err1 = blobs.get_bytes(layout.error_key(batch_id))
    assert out1 is not None and len(out1) > 2 * MIN_PART_BYTES
    assert sorted(out1.splitlines(keepends=True)) == sorted(expected_ok)
    assert err1 is not None and sorted(err1.splitlines(keepends=True)) == sorted(expected_err)
    batch = services.batches.get("default", batch_id)
    assert batch.request_counts.model_dump() == {"total": n, "completed": len(expected_ok),
                                                 "failed": len(expected_err)}
    # Finalize crashed after writing the files, before its transition: the retry writes the same bytes.
    services.adapters.table.update(batch_id, set_={"status": "finalizing", "finalize_target": "completed"})
    blobs.delete(layout.output_key(batch_id))
    assert finalize_batch(inp, services).status == "completed"
    assert blobs.get_bytes(layout.output_key(batch_id)) == out1
    assert blobs.get_bytes(layout.error_key(batch_id)) == err1


def test_a_part_that_fails_fails_the_file_and_abort_leaves_no_upload(services: Services) -> None:
    blobs = services.adapters.blobs
    big = b"x" * (6 * 1024 * 1024)
    blobs.put_bytes("src/big", big)
    c = PartComposer(blobs, "dst-broken")
    c.add_range("src/big", 0, big)
    c.add_range("src/gone", 0, big)  # no such object: S3 refuses the copy (in a sending thread)
    with pytest.raises(ClientError):  # S3's own error, raised in the caller's thread
        c.close()
    c.abort()
    assert blobs.get_bytes("dst-broken") is None
    assert not blobs.client.list_multipart_uploads(Bucket=blobs.bucket).get("Uploads")


class _Bytes:
    """Collects what Finalize writes, in order: ranges are read back from the object they name."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.out = bytearray()

    def add_range(self, source: str, start: int, chunk: Any) -> None:
        assert bytes(chunk) == self.data[start:start + len(chunk)]
        self.out += chunk

    def add_bytes(self, chunk: Any) -> None:
        self.out += chunk

    def write(self, chunk: bytes) -> None:
        self.out += chunk


def _odd_checkpoint(rng: random.Random) -> bytes:
    lines = []
    for i in range(rng.randint(1, 60)):
        cid = f"c{rng.randint(0, 40)}" if rng.random() < 0.2 else f"u{i}"
        usage = rng.choice([
            {"prompt_tokens": 3, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 1}},
            {"input_tokens": 4, "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 2}},
            {"prompt_tokens": None}, {}, None, {"prompt_tokens": 2.0}, {"completion_tokens": True}])
        status = rng.choice([200] * 8 + [201, 400, 500])
        line = dumps_line({"custom_id": cid, "response": {"status_code": status, "body": {"usage": usage}}})
        if rng.random() < 0.05:
            line = dumps_line({"custom_id": cid, "response": None, "error": {"code": "x"}})
        if rng.random() < 0.05:
            line = line[:-1] + b"\r\n"
        if rng.random() < 0.03:
            line += b"\n"  # a blank line after it
        lines.append(line)
    data = b"".join(lines)
    return data[:-1] if rng.random() < 0.2 else data  # maybe no newline after the last line


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32), st.sampled_from([1, 64, 300, 1 << 20]))
def test_bulk_counted_pieces_write_and_count_as_line_by_line(seed: int, piece: int) -> None:
    """Finalize's bulk path (results.tally_plain_lines) gives the same bytes, errors and tallies as the
    line-by-line path alone, whatever the piece size."""
    rng = random.Random(seed)
    objects = [_odd_checkpoint(rng) for _ in range(rng.randint(1, 3))]

    def run(bulk: bool) -> tuple[bytes, bytes, Tally, set[int]]:
        seen: set[int] = set()
        tally = Tally()
        out, err = bytearray(), _Bytes(b"")
        with mock.patch.object(finalize, "PIECE_BYTES", piece), \
                mock.patch.object(finalize, "tally_plain_lines", finalize.tally_plain_lines if bulk
                                  else (lambda *a: 0)):
            for data in objects:
                o = _Bytes(data)
                finalize._merge_object("b", "k", data, seen, o, err, tally)  # type: ignore[arg-type]
                out += o.out
        return bytes(out), bytes(err.out), tally, seen

    assert run(bulk=True) == run(bulk=False)


def test_plain_pieces_are_counted_in_bulk() -> None:
    lines = b"".join(dumps_line({"custom_id": f"p{i}", "response": {"status_code": 200, "body": {
        "usage": {"prompt_tokens": 3, "completion_tokens": 2}}}}) for i in range(10))
    seen: set[int] = set()
    tally = Tally()
    assert tally_plain_lines(lines, seen, tally) == 10 and len(seen) == 10
    assert (tally.completed, tally.input_tokens, tally.output_tokens) == (10, 30, 20)
    assert tally_plain_lines(lines, seen, tally) == 0 and tally.completed == 10  # all duplicates now
