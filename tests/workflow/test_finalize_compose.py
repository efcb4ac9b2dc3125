"""Finalize composes the output file from ranges of the checkpoint objects (S3 copies parts of >= 5 MiB):
same lines as reading them through, first result per custom_id wins, and a re-run writes the same file."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from nightbatch import layout
from nightbatch.pipeline import BatchTaskInput, finalize_batch
from nightbatch.pipeline.compose import MIN_PART_BYTES, PartComposer
from nightbatch.results import lines as results
from nightbatch.services import Services
from tests.workflow.conftest import planned_shards

PAD = "x" * 30_000  # ~30 KB per result line: a few hundred lines pass S3's 5 MiB part floor


def result(batch_id: str, custom_id: str, status: int, attempt: str = "a") -> bytes:
    body: dict[str, Any] = (
        {"object": "chat.completion", "choices": [{"message": {"content": PAD + attempt}}],
         "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}
        if status == 200 else {"error": {"message": "bad", "type": "BadRequestError", "param": None, "code": 400}})
    return results.encode(batch_id, custom_id, response=results.Response(status, f"req_{custom_id}", body))


def test_composer_copies_big_ranges_and_merges_small_ones(services: Services) -> None:
    blobs = services.adapters.blobs
    big = bytes(range(256)) * (6 * 1024 * 1024 // 256)
    blobs.put_bytes("src/big", big)
    huge = big + big
    blobs.put_bytes("src/huge", huge)
    reads: list[tuple[int, int]] = []

    def read(a: int, b: int) -> bytes:
        reads.append((a, b))
        return huge[a:b]  # big is its head

    c = PartComposer(blobs, "dst")
    c.add_bytes(b"head\n")
    c.add_range("src/big", 0, len(big), read)   # under 5 MiB left after a top-up: merged whole
    c.add_range("src/big", 10, 20, read)        # too small: merged
    c.add_range("src/big", 0, len(big), read)   # the pending part is over 5 MiB: sent, then a copy
    c.add_range("src/big", 0, len(big), read)   # nothing pending: copied
    c.add_range("src/big", 10, 20, read)        # merged
    c.add_range("src/huge", 0, len(huge), read)  # topped up from its head, the rest copied
    assert c.close() == 5 + 5 * len(big) + 20
    assert blobs.get_bytes("dst") == b"head\n" + big + big[10:20] + big + big + big[10:20] + huge
    assert c.copied == 4 * len(big) - (MIN_PART_BYTES - 10)
    # Only the bytes that go through this process were asked for.
    assert reads == [(0, len(big)), (10, 20), (10, 20), (0, MIN_PART_BYTES - 10)]
    small = PartComposer(blobs, "dst-small")
    small.add_range("src/big", 0, 100, read)
    assert small.close() == 100 and blobs.get_bytes("dst-small") == big[:100]
    assert PartComposer(blobs, "dst-empty").close() == 0 and blobs.get_bytes("dst-empty") is None


def test_finalize_rerun_writes_the_same_files(services: Services) -> None:
    n = 900
    batch_id, shards = planned_shards(services, n, segment_max_lines=300, shard_target_tokens=2_000)
    assert len(shards) > 1
    inp = BatchTaskInput(batch_id=batch_id)
    blobs = services.adapters.blobs
    expected_ok: list[bytes] = []
    expected_err: list[bytes] = []
    for shard_id, ids in shards:
        objects: list[list[bytes]] = [[], [], []]
        for j, cid in enumerate(ids):
            line = result(batch_id, cid, 400 if j % 97 == 5 else 200)
            # Most lines in one big checkpoint, the rest in small ones; a zombie re-run repeats a few.
            objects[0 if j < len(ids) * 0.8 else 1 + j % 2].append(line)
            (expected_ok if j % 97 != 5 else expected_err).append(line)
        objects[2][:0] = [result(batch_id, ids[0], 200, attempt="zombie")]  # read after object 0: loses
        objects[1].append(objects[1][0].rstrip(b"\n") + b"\r\n")  # a CRLF duplicate: loses too
        objects[1][1] = objects[1][1].rstrip(b"\n") + b"\r\n"  # CRLF: written without the CR
        prefix = layout.results_prefix(batch_id, shard_id)
        for k, lines in enumerate(objects):
            blobs.put_bytes(f"{prefix}{k:06d}-a.jsonl", b"".join(lines))
        blobs.put_bytes(layout.done_key(batch_id, shard_id), b"{}")
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
    c.add_range("src/big", 0, len(big), lambda a, b: big[a:b])
    # No such object: S3 refuses the copy (in a sending thread).
    c.add_range("src/gone", 0, len(big), lambda a, b: big[a:b])
    with pytest.raises(ClientError):  # S3's own error, raised in the caller's thread
        c.close()
    c.abort()
    assert blobs.get_bytes("dst-broken") is None
    assert not blobs.client.list_multipart_uploads(Bucket=blobs.bucket).get("Uploads")
