"""Finalize composes the output file from ranges of the checkpoint objects (S3 copies parts of >= 5 MiB):
same lines as reading them through, first result per custom_id wins, and a re-run writes the same file."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from nightbatch import layout
from nightbatch.aws.records import BatchRecord
from nightbatch.batches.accounting import AttemptRecord, write_attempt
from nightbatch.pipeline import BatchTaskInput, finalize_batch
from nightbatch.results import lines as results
from nightbatch.results.compose import MIN_PART_BYTES, PartComposer
from nightbatch.wiring import Services
from tests.support.pipeline_world import planned_shards

PAD = "x" * 30_000  # ~30 KB per result line: a few hundred lines pass S3's 5 MiB part floor


def result(batch_id: str, custom_id: str, status: int, attempt: str = "a") -> bytes:
    body: dict[str, Any] = (
        {"object": "chat.completion", "choices": [{"message": {"content": PAD + attempt}}],
         "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}
        if status == 200 else {"error": {"message": "bad", "type": "BadRequestError", "param": None, "code": 400}})
    return results.encode(batch_id, custom_id, response=results.Response(status, f"req_{custom_id}", body))


def test_composer_copies_big_ranges_and_uploads_only_the_small_ones(services: Services) -> None:
    """Bytes written once: a range of >= 5 MiB is copied whole even when small ones are pending (they wait in
    the merged part, which goes out whole, at a line boundary, once it holds 8 MiB or at the end): the bytes
    uploaded are the small ranges' and nothing more, and no line is split or reordered inside."""
    blobs = services.adapters.blobs
    line = b"x" * 1023 + b"\n"
    big = line * (6 * 1024)  # 6 MiB of 1 KiB lines
    blobs.put_bytes("src/big", big)
    reads: list[tuple[int, int]] = []

    def read(a: int, b: int) -> bytes:
        reads.append((a, b))
        return big[a:b]

    c = PartComposer(blobs, "dst")
    c.add_bytes(b"head\n")
    c.add_range("src/big", 0, len(big), read)        # copied, though a small part is pending
    c.add_range("src/big", 1024, 2048, read)         # small: merged
    c.add_range("src/big", 0, 4 * 1024 * 1024, read)  # under 5 MiB: merged, the part now holds 4 MiB + 1 KiB
    c.add_range("src/big", 0, len(big), read)        # copied
    c.add_range("src/big", 0, 4 * 1024 * 1024, read)  # merged: the part passes 8 MiB and is sent, whole
    c.add_range("src/big", 2048, 3072, read)         # merged, the last part
    small = 5 + 1024 + 2 * 4 * 1024 * 1024 + 1024
    assert c.close() == small + 2 * len(big)
    assert c.copied == 2 * len(big)
    assert sum(b - a for a, b in reads) == small - 5  # only the small ranges went through this process
    out = blobs.get_bytes("dst")
    assert out is not None and sorted(out.splitlines(keepends=True)) == sorted([b"head\n", *[line] * (
        (small - 5 + 2 * len(big)) // 1024)])
    parts = blobs.client.head_object(Bucket=blobs.bucket, Key="dst", PartNumber=1)["PartsCount"]
    assert parts == 4  # big, big, the merged 8 MiB, the merged rest
    alone = PartComposer(blobs, "dst-small")
    alone.add_range("src/big", 0, 100, read)
    assert alone.close() == 100 and blobs.get_bytes("dst-small") == big[:100]
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


def test_finalize_lists_the_batch_results_once(services: Services) -> None:
    """One listing of the batch's results prefix serves the merge (every shard's checkpoints and summaries), the
    attempts' GPU time and the capacity decisions, however many shards (nightbatch.results.precedence.results_listing);
    no error line means no PUT of an error file."""
    batch_id, shards = planned_shards(services, 40, segment_max_lines=10, shard_target_tokens=200)
    assert len(shards) > 2
    blobs = services.adapters.blobs
    for n, (shard_id, ids) in enumerate(shards):
        prefix = layout.results_prefix(batch_id, shard_id)
        blobs.put_bytes(layout.checkpoint_key(prefix, 0, "a"), b"".join(result(batch_id, c, 200) for c in ids))
        write_attempt(blobs, prefix, AttemptRecord(attempt="a", inference_seconds=10.0 + n))
        blobs.put_bytes(layout.capacity_key(prefix, 0), b'{"action": "spot", "attempt": 0}')
        blobs.put_bytes(layout.done_key(batch_id, shard_id), b"{}")
    calls: list[tuple[str, str]] = []

    def count(params: dict[str, Any], model: Any, **_: Any) -> None:
        calls.append((model.name, params.get("Prefix") or params.get("Key") or ""))

    blobs.client.meta.events.register("before-parameter-build.s3", count)
    try:
        assert finalize_batch(BatchTaskInput(batch_id=batch_id), services).status == "completed"
    finally:
        blobs.client.meta.events.unregister("before-parameter-build.s3", count)
    results = layout.all_results_prefix(batch_id)
    assert [c for c in calls if c[0] == "ListObjectsV2" and c[1].startswith(results)] == [("ListObjectsV2", results)]
    assert ("PutObject", layout.error_key(batch_id)) not in calls and blobs.size(layout.error_key(batch_id)) is None
    batch = services.batches.get("default", batch_id)
    assert batch.request_counts.model_dump() == {"total": 40, "completed": 40, "failed": 0}
    assert batch.error_file_id is None
    record = services.adapters.table.get_record(BatchRecord, batch_id)
    assert record is not None and record.ext is not None
    ext = record.ext
    assert len(ext["capacity"]) == len(shards)
    assert ext["cost"]["gpu_seconds"] == sum(10.0 + n for n in range(len(shards)))
