"""The Uploads API through the OpenAI SDK over real HTTP: round trips, md5, sizes, expiry, cancel, limits."""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import requests

from nightbatch.clock import now
from nightbatch.tenancy.keys import KeyStore
from tests.files.stack import API_KEY, MiB, Stack


def write(tmp_path: Path, name: str, size: int) -> tuple[Path, bytes]:
    data = os.urandom(size)
    path = tmp_path / name
    path.write_bytes(data)
    return path, data


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def test_chunked_round_trip_with_api_gateway_part_size(
    stack: Stack, client: openai.OpenAI, tmp_path: Path
) -> None:
    # 4 MiB parts (what fits through API Gateway) are under S3's 5 MiB multipart minimum: merged on compose.
    path, data = write(tmp_path, "input.jsonl", 10 * MiB + 12345)
    upload = client.uploads.upload_file_chunked(
        file=path,
        mime_type="application/jsonl",
        purpose="batch",
        part_size=4 * MiB,
        md5=md5(data),
    )
    assert upload.status == "completed" and upload.id.startswith("upload_")
    assert (
        upload.file is not None and upload.file.bytes == len(data) and upload.file.filename == "input.jsonl"
    )
    assert upload.file.purpose == "batch" and upload.file.status == "processed"
    assert upload.expires_at == upload.created_at + 3600
    stack.jobs.drain()
    item = stack.file_item(upload.file.id)
    assert "parts" not in item and item["s3_key"] == f"files/{upload.file.id}"
    assert stack.part_keys(upload.id) == []  # purged after the (test-shortened) grace period
    content = client.files.content(upload.file.id).read()
    assert md5(content) == md5(data) and content == data
    assert client.files.retrieve(upload.file.id).bytes == len(data)


@pytest.mark.slow
def test_chunked_round_trip_with_sdk_default_part_size(
    stack: Stack, client: openai.OpenAI, tmp_path: Path
) -> None:
    # The SDK's default part (64 MiB) is accepted locally; 70 MiB makes a full part and a short one.
    path, data = write(tmp_path, "big.jsonl", 70 * MiB)
    upload = client.uploads.upload_file_chunked(
        file=path,
        mime_type="application/jsonl",
        purpose="batch",
        md5=md5(data),
    )
    assert upload.file is not None and upload.file.bytes == len(data)
    stack.jobs.drain()
    assert "parts" not in stack.file_item(upload.file.id)
    assert md5(client.files.content(upload.file.id).read()) == md5(data)


def test_empty_upload_makes_an_empty_file(client: openai.OpenAI) -> None:
    upload = client.uploads.upload_file_chunked(
        file=b"",
        filename="empty.jsonl",
        bytes=0,
        mime_type="application/jsonl",
        purpose="batch",
    )
    assert upload.status == "completed" and upload.file is not None and upload.file.bytes == 0
    assert client.files.content(upload.file.id).read() == b""


def test_mismatched_byte_count_is_refused(stack: Stack, client: openai.OpenAI) -> None:
    upload = client.uploads.create(
        bytes=100, filename="a.jsonl", mime_type="application/jsonl", purpose="batch"
    )
    assert upload.status == "pending" and upload.file is None
    part = client.uploads.parts.create(upload_id=upload.id, data=b"x" * 60)
    assert part.id.startswith("part_") and part.upload_id == upload.id and part.object == "upload.part"
    with pytest.raises(openai.BadRequestError) as err:
        client.uploads.complete(upload_id=upload.id, part_ids=[part.id])
    assert err.value.code == "upload_size_mismatch" and "60 bytes" in err.value.message
    # The upload is still pending: the missing bytes can follow.
    rest = client.uploads.parts.create(upload_id=upload.id, data=b"y" * 40)
    done = client.uploads.complete(upload_id=upload.id, part_ids=[part.id, rest.id])
    assert done.status == "completed" and done.file is not None
    # Composed first: with the test stack's 0 s grace, a read through the parts could lose them mid-stream.
    stack.jobs.drain()
    assert client.files.content(done.file.id).read() == b"x" * 60 + b"y" * 40


def test_unknown_and_duplicate_part_ids_are_refused(client: openai.OpenAI) -> None:
    upload = client.uploads.create(
        bytes=8, filename="a.jsonl", mime_type="application/jsonl", purpose="batch"
    )
    part = client.uploads.parts.create(upload_id=upload.id, data=b"abcd")
    for part_ids in ([part.id, part.id], [part.id, "part_000000000000000000000000"], ["../../files/x"]):
        with pytest.raises(openai.BadRequestError) as err:
            client.uploads.complete(upload_id=upload.id, part_ids=part_ids)
        assert err.value.param == "part_ids"


def test_md5_checked_from_the_running_digest(client: openai.OpenAI) -> None:
    data = os.urandom(300_000)
    upload = client.uploads.create(
        bytes=len(data), filename="a.jsonl", mime_type="text/plain", purpose="batch"
    )
    ids = [
        client.uploads.parts.create(upload_id=upload.id, data=data[i : i + 100_000]).id
        for i in range(0, len(data), 100_000)
    ]
    with pytest.raises(openai.BadRequestError) as err:
        client.uploads.complete(upload_id=upload.id, part_ids=ids, md5="0" * 32)
    assert err.value.code == "md5_mismatch" and err.value.param == "md5"
    done = client.uploads.complete(upload_id=upload.id, part_ids=ids, md5=md5(data).upper())
    assert done.status == "completed"
    # A retried complete (the SDK retries POSTs) answers the same File.
    again = client.uploads.complete(upload_id=upload.id, part_ids=ids, md5=md5(data))
    assert again.file is not None and done.file is not None and again.file.id == done.file.id


@contextlib.contextmanager
def part_reads(stack: Stack, upload_id: str) -> Iterator[list[str]]:
    """The names of the threads that issue an S3 GetObject on the Upload's parts (a botocore hook on the
    stack's real client, against moto)."""
    threads: list[str] = []

    def hook(params: dict[str, Any], **_: Any) -> None:
        if str(params.get("Key", "")).startswith(f"uploads/{upload_id}/"):
            threads.append(threading.current_thread().name)

    events = stack.services.uploads.parts.client.meta.events
    events.register("provide-client-params.s3.GetObject", hook, unique_id=f"part-reads-{upload_id}")
    try:
        yield threads
    finally:
        events.unregister("provide-client-params.s3.GetObject", unique_id=f"part-reads-{upload_id}")


@pytest.mark.parametrize("correct", [True, False])
def test_md5_without_a_running_digest_is_checked_by_the_compose_step_never_by_complete(
    stack: Stack,
    client: openai.OpenAI,
    correct: bool,
) -> None:
    # Parts listed out of arrival order: the running digest cannot give the md5 (M5: /complete re-read up to
    # 512 MiB inside the API Lambda; now only the compose step reads the parts).
    a, b = b'{"a": 1}\n', b'{"b": 2}\n'
    upload = client.uploads.create(
        bytes=len(a + b), filename="in.jsonl", mime_type="text/plain", purpose="batch"
    )
    pa = client.uploads.parts.create(upload_id=upload.id, data=a).id
    pb = client.uploads.parts.create(upload_id=upload.id, data=b).id
    with part_reads(stack, upload.id) as readers:
        done = client.uploads.complete(
            upload_id=upload.id, part_ids=[pb, pa], md5=md5(b + a if correct else a + b)
        )
        assert (
            done.file is not None and done.file.status == "uploaded"
        )  # the SDK's wait_for_processing polls this
        stack.jobs.drain()
    assert readers, "the compose step read the parts to check the md5"
    assert all(name.startswith("compose") for name in readers), f"parts read outside composition: {readers}"
    file = client.files.retrieve(done.file.id)
    if correct:
        assert file.status == "processed"
        assert client.files.content(file.id).read() == b + a
        return
    assert file.status == "error" and file.status_details
    assert f"md5 given at upload completion ({md5(a + b)}) does not match" in file.status_details
    with pytest.raises(openai.BadRequestError) as err:
        client.files.content(file.id).read()
    assert err.value.code == "file_unusable"
    with pytest.raises(openai.BadRequestError) as err:
        client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert err.value.param == "input_file_id"


def test_expired_upload_refuses_parts_and_complete(stack: Stack, client: openai.OpenAI) -> None:
    upload = client.uploads.create(bytes=8, filename="a.jsonl", mime_type="text/plain", purpose="batch")
    assert upload.expires_at == upload.created_at + round(stack.settings.validation.hour_seconds)
    part = client.uploads.parts.create(upload_id=upload.id, data=b"abcd")
    # Its hour passes (moved in the table: a 1-second hour raced the first part on a loaded machine).
    stack.services.adapters.table.update(upload.id, set_={"expires_at": now() - 1})
    with pytest.raises(openai.ConflictError) as err:
        client.uploads.parts.create(upload_id=upload.id, data=b"efgh")
    assert err.value.code == "upload_expired" and "expired" in err.value.message
    assert err.value.response.headers["x-should-retry"] == "false"
    with pytest.raises(openai.ConflictError) as err:
        client.uploads.complete(upload_id=upload.id, part_ids=[part.id])
    assert err.value.code == "upload_expired"
    assert stack.part_keys(upload.id) == []
    assert client.uploads.cancel(upload_id=upload.id).status == "expired"


def test_cancelled_upload_refuses_parts_and_complete(stack: Stack, client: openai.OpenAI) -> None:
    upload = client.uploads.create(bytes=8, filename="a.jsonl", mime_type="text/plain", purpose="batch")
    part = client.uploads.parts.create(upload_id=upload.id, data=b"abcd")
    cancelled = client.uploads.cancel(upload_id=upload.id)
    assert cancelled.status == "cancelled" and cancelled.file is None
    assert stack.part_keys(upload.id) == []
    with pytest.raises(openai.ConflictError) as err:
        client.uploads.parts.create(upload_id=upload.id, data=b"efgh")
    assert err.value.code == "upload_cancelled" and "cancelled" in err.value.message
    with pytest.raises(openai.ConflictError):
        client.uploads.complete(upload_id=upload.id, part_ids=[part.id])
    assert client.uploads.cancel(upload_id=upload.id).status == "cancelled"


def test_completed_upload_refuses_parts_and_cancel(client: openai.OpenAI) -> None:
    upload = client.uploads.upload_file_chunked(
        file=b"abc", filename="a.jsonl", bytes=3, mime_type="text/plain", purpose="batch"
    )
    with pytest.raises(openai.ConflictError) as err:
        client.uploads.parts.create(upload_id=upload.id, data=b"d")
    assert err.value.code == "upload_completed"
    with pytest.raises(openai.ConflictError):
        client.uploads.cancel(upload_id=upload.id)


def test_create_checks_bytes_purpose_and_expiry(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.uploads.create(bytes=8 * 1024**3 + 1, filename="a", mime_type="text/plain", purpose="batch")
    assert err.value.param == "bytes" and "8 GiB" in err.value.message
    with pytest.raises(openai.BadRequestError) as err:
        client.uploads.create(bytes=1, filename="a", mime_type="text/plain", purpose="nonsense")  # type: ignore[arg-type]
    assert err.value.param == "purpose"
    with pytest.raises(openai.BadRequestError) as err:
        client.uploads.create(
            bytes=1,
            filename="a",
            mime_type="text/plain",
            purpose="batch",
            expires_after={"anchor": "created_at", "seconds": 60},
        )
    assert err.value.param == "expires_after.seconds"
    up = client.uploads.create(
        bytes=1,
        filename="a",
        mime_type="text/plain",
        purpose="user_data",
        expires_after={"anchor": "created_at", "seconds": 7200},
    )
    part = client.uploads.parts.create(upload_id=up.id, data=b"z")
    done = client.uploads.complete(upload_id=up.id, part_ids=[part.id])
    assert done.file is not None and done.file.expires_at == done.file.created_at + 7200


def test_part_over_the_limit_is_413_naming_the_limit(stack: Stack, override: Callable[..., None]) -> None:
    override(max_upload_part_bytes=1 * MiB)
    auth = {"Authorization": f"Bearer {API_KEY}"}
    up = requests.post(
        f"{stack.base_url}/uploads",
        headers=auth,
        timeout=30,
        json={"bytes": 3 * MiB, "filename": "a", "mime_type": "text/plain", "purpose": "batch"},
    ).json()
    for size in (MiB + 1, 3 * MiB):  # checked by the route, then by the body-limit middleware
        r = requests.post(
            f"{stack.base_url}/uploads/{up['id']}/parts",
            headers=auth,
            timeout=30,
            files={"data": ("upload", b"x" * size, "application/octet-stream")},
        )
        assert r.status_code == 413, r.text
        assert "1 MiB part limit" in r.json()["error"]["message"]
    r = requests.post(
        f"{stack.base_url}/uploads/{up['id']}/parts",
        headers=auth,
        timeout=30,
        files={"data": ("upload", b"x" * MiB, "application/octet-stream")},
    )
    assert r.status_code == 200 and r.json()["object"] == "upload.part"


def test_unknown_upload_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.uploads.parts.create(upload_id="upload_000000000000000000000000", data=b"x")
    with pytest.raises(openai.NotFoundError):
        client.uploads.complete(upload_id="upload_nope", part_ids=[])


def test_create_honours_idempotency_key(client: openai.OpenAI) -> None:
    kw = dict(bytes=10, filename="a.jsonl", mime_type="text/plain", purpose="batch")
    headers = {"Idempotency-Key": f"up-{os.urandom(8).hex()}"}
    first = client.uploads.with_raw_response.create(**kw, extra_headers=headers)  # type: ignore[arg-type]
    again = client.uploads.with_raw_response.create(**kw, extra_headers=headers)  # type: ignore[arg-type]
    assert again.parse().id == first.parse().id
    assert again.headers.get("idempotent-replayed") == "true"
    with pytest.raises(openai.ConflictError):  # same key, another request
        client.uploads.create(**{**kw, "bytes": 11}, extra_headers=headers)  # type: ignore[arg-type]


def test_another_tenants_upload_is_404(stack: Stack, client: openai.OpenAI) -> None:
    key, _ = KeyStore(stack.services.adapters.table).create(name="uploads-other", tenant="other-tenant")
    other = openai.OpenAI(base_url=stack.base_url, api_key=key, max_retries=0)
    upload = client.uploads.create(bytes=1, filename="a", mime_type="text/plain", purpose="batch")
    part = client.uploads.parts.create(upload_id=upload.id, data=b"x")
    with pytest.raises(openai.NotFoundError):
        other.uploads.parts.create(upload_id=upload.id, data=b"y")
    with pytest.raises(openai.NotFoundError):
        other.uploads.complete(upload_id=upload.id, part_ids=[part.id])
    with pytest.raises(openai.NotFoundError):
        other.uploads.cancel(upload_id=upload.id)
    done = client.uploads.complete(upload_id=upload.id, part_ids=[part.id])
    assert done.file is not None
    with pytest.raises(openai.NotFoundError):
        other.files.content(done.file.id)
