"""M6: an Upload cannot take more bytes or parts than allowed (checked in the UpdateItem, so concurrent parts
cannot race past), a tenant's stored bytes are a limit, and abandoned Uploads are swept."""

from __future__ import annotations

import time
from collections.abc import Callable

import openai
import pytest

from nightbatch.clock import now
from nightbatch.errors import InvalidRequestError
from nightbatch.pipeline.sweep import sweep
from nightbatch.tenancy.keys import KeyStore
from nightbatch.tenancy.limits import read_usage, recount_storage
from tests.files.stack import Stack


def test_parts_past_the_declared_size_are_refused(stack: Stack, client: openai.OpenAI) -> None:
    upload = client.uploads.create(bytes=10, filename="in.jsonl", mime_type="text/plain", purpose="batch")
    for _ in range(2):
        client.uploads.parts.create(upload_id=upload.id, data=b"abcd")
    with pytest.raises(openai.BadRequestError) as err:
        client.uploads.parts.create(upload_id=upload.id, data=b"abcd")
    assert err.value.code == "upload_size_exceeded"
    assert len(stack.part_keys(upload.id)) == 2, "a refused part never reached S3"
    client.uploads.parts.create(upload_id=upload.id, data=b"ab")
    assert stack.services.adapters.table.get(upload.id)["bytes_received"] == 10


@pytest.mark.parametrize("limit", ["bytes", "parts"])
def test_the_checks_are_conditions_of_the_update_not_of_an_earlier_read(
        stack: Stack, client: openai.OpenAI, override: Callable[..., None], limit: str) -> None:
    """A racing part decides on what it read; the UpdateItem's condition sees what is stored now."""
    override(max_upload_parts=2 if limit == "parts" else 100)
    upload = client.uploads.create(bytes=8, filename="in.jsonl", mime_type="text/plain", purpose="batch")
    uploads = stack.services.uploads
    stale = uploads.item("default", upload.id)  # what a concurrent request read before the others landed
    for _ in range(2):
        client.uploads.parts.create(upload_id=upload.id, data=b"abcd" if limit == "bytes" else b"a")
    with pytest.raises(InvalidRequestError) as err:
        uploads._reserve_part("default", stale, 4 if limit == "bytes" else 1)
    assert err.value.code == ("upload_size_exceeded" if limit == "bytes" else "too_many_parts")


def test_stored_bytes_are_a_tenant_limit(stack: Stack, override: Callable[..., None]) -> None:
    tenant = f"quota-{time.time_ns()}"
    key, _ = KeyStore(stack.services.adapters.table).create(name="quota", tenant=tenant)
    client = openai.OpenAI(base_url=stack.base_url, api_key=key, max_retries=0)
    override(limit_stored_bytes=1000)
    f = client.files.create(file=("a.jsonl", b"x" * 600), purpose="batch")
    with pytest.raises(openai.BadRequestError) as err:
        client.files.create(file=("b.jsonl", b"x" * 500), purpose="batch")
    assert err.value.code == "storage_quota_exceeded"
    with pytest.raises(openai.BadRequestError) as err:
        client.uploads.create(bytes=500, filename="in.jsonl", mime_type="text/plain", purpose="batch")
    assert err.value.code == "storage_quota_exceeded"
    limits = client.get("/nightbatch/limits", cast_to=object)
    assert limits["limits"]["stored_bytes"] == 1000 and limits["usage"]["stored_bytes"] == 600
    client.files.delete(f.id)
    up = client.uploads.create(bytes=900, filename="in.jsonl", mime_type="text/plain", purpose="batch")
    assert read_usage(stack.services.adapters.table, tenant).stored_bytes == 900
    client.uploads.cancel(up.id)
    assert read_usage(stack.services.adapters.table, tenant).stored_bytes == 0
    assert recount_storage(stack.services.adapters.table, tenant) == 0


def test_the_sweeper_expires_abandoned_uploads_and_their_parts(stack: Stack, client: openai.OpenAI) -> None:
    upload = client.uploads.create(bytes=100, filename="in.jsonl", mime_type="text/plain", purpose="batch")
    client.uploads.parts.create(upload_id=upload.id, data=b"abc")
    assert stack.part_keys(upload.id)
    # Its hour passes (moved in the table: a 1-second hour raced the part on a loaded machine).
    stack.services.adapters.table.update(upload.id, set_={"expires_at": now() - 1})
    report = sweep(stack.services)
    assert upload.id in report["expired_uploads"]
    assert stack.part_keys(upload.id) == []
    item = stack.services.adapters.table.get(upload.id)
    assert item["status"] == "expired" and "open_status" not in item
