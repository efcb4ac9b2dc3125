"""Composition of parts into one object, the running md5, the compose-upload task over SQS, tenant scoping."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from functions.tasks import compose_upload
from nightbatch.aws.parts import MIN_PART_BYTES, PartStore, plan
from nightbatch.aws.sqs import SqsUploadJobs
from nightbatch.errors import NotFoundError
from nightbatch.files.digests import RunningDigests
from nightbatch.files.uploads import CompleteUploadRequest, CreateUploadRequest
from nightbatch.layout import INPUT_TAGS
from nightbatch.local.runner import LocalWorkflow
from nightbatch.wiring import build_services
from tests.files.stack import MiB, Stack


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=20 * MiB), min_size=1, max_size=12))
def test_plan_covers_every_byte_in_order_with_parts_s3_accepts(sizes: list[int]) -> None:
    sources = [(f"k{i}", size) for i, size in enumerate(sizes)]
    steps = list(plan(sources))
    covered = [(seg.key, seg.start, seg.end) for step in steps for seg in step]
    expected_pos = [(k, 0) for k, _ in sources]
    # Contiguous: each segment starts where the previous one of its source ended, sources in order.
    pos = {k: 0 for k, _ in sources}
    order = []
    for key, start, end in covered:
        assert start == pos[key] and end > start
        pos[key] = end
        if not order or order[-1] != key:
            order.append(key)
    assert pos == dict(sources) and order == [k for k, _ in expected_pos]
    for step in steps[:-1]:
        assert sum(seg.end - seg.start for seg in step) >= MIN_PART_BYTES
    for step in steps:
        assert sum(seg.end - seg.start for seg in step) <= max(max(sizes), 8 * MiB)
        assert all(not seg.copy for seg in step) or len(step) == 1


def test_compose_mixes_server_side_copies_and_merged_small_parts(stack: Stack) -> None:
    store = PartStore(stack.services.files.blobs)
    sizes = [3 * MiB, 7 * MiB, 2 * MiB + 5, 12 * MiB, 1, 6 * MiB, 100]
    blobs = [os.urandom(n) for n in sizes]
    keys = [f"uploads/test-compose/parts/p{i}" for i in range(len(sizes))]
    for key, data in zip(keys, blobs, strict=True):
        store.put(key, io.BytesIO(data), md5=hashlib.md5(data).digest())
    assert store.sizes("uploads/test-compose/parts/") == dict(zip(keys, sizes, strict=True))
    steps = list(plan(list(zip(keys, sizes, strict=True))))
    assert any(s[0].copy for s in steps) and any(not s[0].copy for s in steps)
    store.compose("files/test-composed", list(zip(keys, sizes, strict=True)))
    whole = b"".join(blobs)
    assert stack.services.files.blobs.get_bytes("files/test-composed") == whole
    assert store.md5(keys) == hashlib.md5(whole).hexdigest()
    store.compose("files/test-single", [(keys[0], sizes[0])])
    assert stack.services.files.blobs.get_bytes("files/test-single") == blobs[0]
    store.compose("files/test-empty", [])
    assert stack.services.files.blobs.get_bytes("files/test-empty") == b""
    stack.services.files.blobs.delete_prefix("uploads/test-compose/")


def test_compose_writes_the_object_tagged_by_either_path(stack: Stack) -> None:
    """A batch's input tag (layout.INPUT_TAGS) set at write time, on a copy (one part) as on a multipart upload;
    no tag asked, none written, even when the one part copied is tagged."""
    store = PartStore(stack.services.files.blobs)
    blobs = stack.services.files.blobs
    keys = ["uploads/test-tags/parts/p0", "uploads/test-tags/parts/p1"]
    for key in keys:
        store.put(key, io.BytesIO(b"x" * 10), md5=hashlib.md5(b"x" * 10).digest())
    store.compose("files/test-tags-one", [(keys[0], 10)], tags=INPUT_TAGS)
    store.compose("files/test-tags-many", [(k, 10) for k in keys], tags=INPUT_TAGS)
    assert blobs.tags("files/test-tags-one") == blobs.tags("files/test-tags-many") == INPUT_TAGS
    store.compose("files/test-untagged", [(k, 10) for k in keys])
    assert blobs.tags("files/test-untagged") == {}
    blobs.delete_prefix("uploads/test-tags/")


def test_running_digest_follows_arrival_order_only() -> None:
    digests = RunningDigests()
    digests.start("u1")
    for pid, chunk in (("p1", b"ab"), ("p2", b"cd")):
        running, base = digests.fork("u1")
        running.update(chunk)
        digests.advance("u1", base, running, pid)
    assert digests.hexdigest("u1", ["p1", "p2"]) == hashlib.md5(b"abcd").hexdigest()
    assert digests.hexdigest("u1", ["p2", "p1"]) is None
    # Two parts in flight at once: no single arrival order, so no running digest.
    a, base_a = digests.fork("u1")
    b, base_b = digests.fork("u1")
    digests.advance("u1", base_a, a, "p3")
    digests.advance("u1", base_b, b, "p4")
    assert digests.hexdigest("u1", ["p1", "p2", "p3"]) is None
    assert digests.fork("unknown") == (None, -1)


def test_compose_task_over_sqs(stack: Stack) -> None:
    adapters = stack.services.adapters
    sqs = adapters.client("sqs")
    queue_url = sqs.create_queue(QueueName="nb-uploads-compose")["QueueUrl"]
    services = build_services(
        adapters,
        LocalWorkflow(adapters, engines=False),
        upload_jobs=SqsUploadJobs(client=sqs, queue_url=queue_url),
    )
    data = [os.urandom(3 * MiB), os.urandom(3 * MiB), b"tail"]
    up = services.uploads.create(
        "default",
        CreateUploadRequest(
            bytes=sum(map(len, data)), filename="q.bin", mime_type="application/octet-stream", purpose="batch"
        ),
    )
    ids = [services.uploads.add_part("default", up.id, io.BytesIO(d), len(d)).id for d in data]
    done = services.uploads.complete("default", up.id, CompleteUploadRequest(part_ids=ids))
    assert done.file is not None

    def deliver() -> list[object]:
        msgs = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1)["Messages"]
        for m in msgs:
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=m["ReceiptHandle"])
        return compose_upload.run(services, {"Records": [{"body": m["Body"]} for m in msgs]})

    assert "parts" in stack.file_item(done.file.id)
    assert deliver() == ["composed"]
    item = stack.file_item(done.file.id)
    assert "parts" not in item
    assert services.files.blobs.get_bytes(item["s3_key"]) == b"".join(data)
    assert deliver() == [None]  # the purge message (grace 0 in these tests)
    assert stack.part_keys(up.id) == []
    body = json.dumps({"task": "compose_upload", "file_id": done.file.id, "upload_id": up.id})
    assert compose_upload.run(services, {"Records": [{"body": body}]}) == ["already composed"]


def test_uploads_are_tenant_scoped(stack: Stack) -> None:
    uploads = stack.services.uploads
    up = uploads.create(
        "default", CreateUploadRequest(bytes=1, filename="t", mime_type="text/plain", purpose="batch")
    )
    with pytest.raises(NotFoundError):
        uploads.add_part("someone-else", up.id, io.BytesIO(b"x"), 1)
    part = uploads.add_part("default", up.id, io.BytesIO(b"x"), 1)
    with pytest.raises(NotFoundError):
        uploads.complete("someone-else", up.id, CompleteUploadRequest(part_ids=[part.id]))
    with pytest.raises(NotFoundError):
        uploads.cancel("someone-else", up.id)
    done = uploads.complete("default", up.id, CompleteUploadRequest(part_ids=[part.id]))
    assert done.file is not None
    with pytest.raises(NotFoundError):
        stack.services.files.get("someone-else", done.file.id)
    stack.jobs.drain()


class HeldJobs:
    """UploadJobs that only record what was asked: the test decides when composition runs."""

    def __init__(self) -> None:
        self.composes: list[tuple[str, str]] = []

    def compose(self, file_id: str, upload_id: str, *, delay_seconds: float = 0.0) -> None:
        self.composes.append((file_id, upload_id))

    def purge_parts(self, upload_id: str, *, delay_seconds: float = 0.0) -> None:
        pass


def test_file_deleted_before_composition_leaves_nothing_behind(stack: Stack) -> None:
    # Composition is held until the File is deleted (a compose delay raced the read below on a loaded machine).
    held = HeldJobs()
    uploads = dataclasses.replace(stack.services.uploads, jobs=held)
    up = uploads.create(
        "default", CreateUploadRequest(bytes=6, filename="d", mime_type="text/plain", purpose="batch")
    )
    ids = [uploads.add_part("default", up.id, io.BytesIO(b"abc"), 3).id for _ in range(2)]
    done = uploads.complete("default", up.id, CompleteUploadRequest(part_ids=ids))
    assert done.file is not None and held.composes == [(done.file.id, up.id)]
    assert b"".join(stack.services.files.chunks(stack.services.files.item("default", done.file.id))) == b"abcabc"
    stack.services.files.delete("default", done.file.id)
    assert stack.services.assembly.compose(done.file.id, up.id) == "file deleted"
    assert stack.part_keys(up.id) == []
    assert not stack.services.files.blobs.exists(f"files/{done.file.id}")
