"""Downloads past the inline limit: a 307 to a pre-signed S3 URL that clients follow without the API key."""

from __future__ import annotations

import io
import os
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

import openai
import requests

from tests.files.stack import API_KEY, MiB, Stack


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {API_KEY}"}


def recording_client(stack: Stack, seen: list[tuple[str, dict[str, str]]]) -> openai.OpenAI:
    def record(request: Any) -> None:
        seen.append((str(request.url), {k.lower(): v for k, v in request.headers.items()}))

    return stack.client(http_client=openai.DefaultHttpxClient(event_hooks={"request": [record]}))


def upload_file(client: openai.OpenAI, data: bytes, name: str = "results.jsonl") -> str:
    return client.files.create(file=(name, data, "application/jsonl"), purpose="batch").id


def upload_chunked(client: openai.OpenAI, data: bytes, filename: str, mime_type: str, *, part_size: int) -> str:
    """The SDK's own chunked upload (the Uploads API); the File's id."""
    upload = client.uploads.upload_file_chunked(
        file=data, filename=filename, bytes=len(data), mime_type=mime_type, purpose="batch", part_size=part_size)
    assert upload.file is not None
    return upload.file.id


def test_sdk_follows_the_redirect_without_the_api_key(stack: Stack, override: Callable[..., None]) -> None:
    override(max_inline_download_bytes=64 * 1024)
    seen: list[tuple[str, dict[str, str]]] = []
    client = recording_client(stack, seen)
    data = os.urandom(200 * 1024)
    file_id = upload_file(client, data)
    seen.clear()
    assert client.files.content(file_id).read() == data
    api, s3 = seen
    assert api[0].startswith(stack.base_url) and api[1]["authorization"] == f"Bearer {API_KEY}"
    assert s3[0].startswith(stack.aws_endpoint) and "X-Amz-Signature=" in s3[0]
    assert "authorization" not in s3[1]
    # Under the limit: inline, one request.
    small = upload_file(client, b'{"ok": true}\n')
    seen.clear()
    assert client.files.content(small).read() == b'{"ok": true}\n'
    assert len(seen) == 1


def test_requests_follows_the_redirect_without_the_api_key(
    stack: Stack, override: Callable[..., None]
) -> None:
    override(max_inline_download_bytes=1024, presigned_url_seconds=60)
    data = os.urandom(10_000)
    file_id = upload_file(stack.client(), data, name="my results.jsonl")
    r = requests.get(f"{stack.base_url}/files/{file_id}/content", headers=auth(), timeout=30)
    assert r.status_code == 200 and r.content == data
    assert [h.status_code for h in r.history] == [307]
    assert r.url.startswith(stack.aws_endpoint)
    assert "Authorization" not in r.request.headers
    query = urllib.parse.parse_qs(urllib.parse.urlparse(r.url).query)
    assert query["X-Amz-Expires"] == ["60"]
    assert 'filename="my results.jsonl"' in query["response-content-disposition"][0]
    assert r.headers["content-disposition"] == 'attachment; filename="my results.jsonl"'


def test_seed_compatible_file_get_redirects_too(stack: Stack, override: Callable[..., None]) -> None:
    # docs/ARCHITECTURE.md, decision 7: GET /v1/files/{id} on a batch_output file answers its content.
    override(max_inline_download_bytes=1024)
    data = b'{"custom_id": "x"}\n' * 200
    out = stack.services.files.create(
        "default",
        filename="batch_out.jsonl",
        purpose="batch_output",
        fileobj=io.BytesIO(data),
        size=len(data),
    )
    r = requests.get(f"{stack.base_url}/files/{out.id}", headers=auth(), timeout=30)
    assert r.status_code == 200 and r.content == data and r.history[0].status_code == 307
    assert "Authorization" not in r.request.headers
    meta = requests.get(
        f"{stack.base_url}/files/{out.id}", headers={**auth(), "Accept": "application/json"}, timeout=30
    )
    assert meta.status_code == 200 and meta.json()["id"] == out.id and not meta.history


def test_file_still_in_parts_streams_locally_and_asks_to_retry_behind_lambda(
    stack: Stack,
    client: openai.OpenAI,
    override: Callable[..., None],
) -> None:
    override(upload_compose_delay_seconds=2.0, max_inline_download_bytes=1024)
    lines = b"".join(
        b'{"custom_id": "r%d", "method": "POST", "url": "/v1/chat/completions", "body": {"model": '
        b'"SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "hi"}]}}\n' % i
        for i in range(100)
    )
    file_id = upload_chunked(client, lines, "in.jsonl", "application/jsonl", part_size=4096)
    item = stack.file_item(file_id)
    assert len(item["parts"]) == -(-len(lines) // 4096)
    # A batch can be created from a file still made of parts.
    batch = client.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert batch.input_file_id == file_id and batch.status == "validating"
    # Local mode: no response limit in front, so the bytes stream through the parts.
    r = requests.get(f"{stack.base_url}/files/{file_id}/content", headers=auth(), timeout=30)
    assert r.status_code == 200 and r.content == lines and not r.history
    # Behind Lambda it cannot answer that much inline: retry once composed.
    override(mode="aws")
    r = requests.get(f"{stack.base_url}/files/{file_id}/content", headers=auth(), timeout=30)
    assert r.status_code == 409 and r.json()["error"]["code"] == "file_not_ready"
    assert r.headers["retry-after"] == "5" and r.headers["x-should-retry"] == "true"
    stack.jobs.drain()
    assert "parts" not in stack.file_item(file_id)
    r = requests.get(f"{stack.base_url}/files/{file_id}/content", headers=auth(), timeout=30)
    assert r.status_code == 200 and r.content == lines and r.history[0].status_code == 307
    # The workflow validated the batch's input (read through the parts, or the composed object).
    deadline = time.monotonic() + 30
    while (batch := client.batches.retrieve(batch.id)).status == "validating":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert batch.errors is None and batch.request_counts is not None and batch.request_counts.total == 100


def test_sdk_retries_until_the_file_is_assembled(stack: Stack, override: Callable[..., None]) -> None:
    # The 409 carries Retry-After and x-should-retry: the SDK's own retries ride out the composition.
    override(upload_compose_delay_seconds=1.0, max_inline_download_bytes=MiB, mode="aws")
    data = os.urandom(3 * MiB)
    client = stack.client()
    file_id = upload_chunked(client, data, "d.bin", "application/octet-stream", part_size=2 * MiB)
    retrying = openai.OpenAI(base_url=stack.base_url, api_key=API_KEY, max_retries=3)
    assert retrying.files.content(file_id).read() == data
