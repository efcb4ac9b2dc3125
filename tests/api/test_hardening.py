"""Hardening: body limits, no internals in error responses, JSON logs without secrets, S3 keys from ids only."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from nightbatch.logs import JsonFormatter, log_context, scrub
from tests.support.tenant_stack import BOOTSTRAP_KEY, Stack, chat_lines, wait_for

INTERNALS = re.compile(r"Traceback|File \"|\.py\b|botocore|boto3|ResourceNotFound|dynamodb|nightbatch\.|"
                       r"functions\.api|Exception\b|moto", re.IGNORECASE)


@pytest.fixture
def captured_logs() -> Iterator[io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    yield out
    root.removeHandler(handler)
    root.setLevel(old_level)


def test_request_bodies_over_the_limits_are_413(make_stack: Any) -> None:
    stack = make_stack(max_upload_bytes=64 * 1024)
    client = stack.client(stack.new_key("team-a"))
    with pytest.raises(openai.APIStatusError) as info:
        client.files.create(file=("big.jsonl", b"x" * (256 * 1024)), purpose="batch")
    assert info.value.status_code == 413 and info.value.code == "payload_too_large"
    assert "Uploads API" in info.value.message
    r = httpx.post(f"{stack.base_url}/batches", content=b"{" + b" " * (2 * 1024 * 1024) + b"}",
                   headers={"Authorization": f"Bearer {BOOTSTRAP_KEY}", "Content-Type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"

    def chunked() -> Iterator[bytes]:  # no Content-Length: the limit holds while the body streams
        for _ in range(64):
            yield b"y" * (64 * 1024)

    r = httpx.post(f"{stack.base_url}/batches", content=chunked(),
                   headers={"Authorization": f"Bearer {BOOTSTRAP_KEY}", "Content-Type": "application/json"})
    assert r.status_code == 413


def test_an_internal_failure_is_a_generic_500(make_stack: Any, captured_logs: io.StringIO) -> None:
    stack = make_stack()
    key = stack.new_key("team-a")
    client = stack.client(key)
    client.files.list()
    # Real AWS failure: the table disappears under the running API.
    stack.services.adapters.client("dynamodb").delete_table(TableName=stack.settings.deployment.table)
    for call in (lambda: httpx.get(f"{stack.base_url}/files", headers={"Authorization": f"Bearer {key}"}),
                 lambda: httpx.get(f"{stack.base_url}/batches/batch_1",
                                   headers={"Authorization": f"Bearer {BOOTSTRAP_KEY}"})):
        r = call()
        assert r.status_code == 500
        body = r.text
        assert not INTERNALS.search(body), body
        assert stack.settings.deployment.table not in body
        assert r.json()["error"]["type"] == "server_error"
        assert r.headers["x-request-id"].startswith("req_")
    lines = [json.loads(x) for x in captured_logs.getvalue().splitlines()]
    errors = [x for x in lines if x["message"] == "unhandled error"]
    assert errors and all(x["request_id"].startswith("req_") for x in errors)
    assert any("ResourceNotFound" in x.get("exception", "") for x in errors)  # the log has what the client lacks
    assert key not in captured_logs.getvalue()


def test_logs_carry_ids_and_no_secrets(make_stack: Any, captured_logs: io.StringIO) -> None:
    stack = make_stack(workflow="local")
    key = stack.new_key("team-a")
    client = stack.client(key)
    marker = "PRIVATE-PROMPT-TEXT-4242"
    content = json.dumps({"custom_id": "c1", "method": "POST", "url": "/v1/chat/completions", "body": {
        "model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": marker}]}}).encode() + b"\n"
    f = client.files.create(file=("in.jsonl", content), purpose="batch")
    batch = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    wait_for(lambda: client.batches.retrieve(batch.id).status in ("completed", "failed"))
    with pytest.raises(openai.AuthenticationError):
        stack.client(key + "x").files.list()
    text = captured_logs.getvalue()
    assert text, "the pipeline logs something"
    records = [json.loads(line) for line in text.splitlines()]  # every line is one JSON object
    assert any(r.get("batch_id") == batch.id for r in records)
    for needle in (key, key[3:], marker, "Bearer", "authorization"):
        assert needle not in text


def test_the_formatter_drops_and_masks_secrets() -> None:
    fmt = JsonFormatter()
    key = "nb-" + "A" * 43
    record = logging.LogRecord("nightbatch.test", logging.INFO, __file__, 1, "got %s", (key,), None)
    record.authorization = f"Bearer {key}"
    record.api_key = key
    record.body = '{"prompt": "secret"}'
    record.batch_id = "batch_123"
    record.note = f"header was Authorization: Bearer {key}"
    with log_context(request_id="req_abc", tenant="team-a"):
        out = json.loads(fmt.format(record))
    assert out["message"] == "got nb-***"
    assert out["request_id"] == "req_abc" and out["tenant"] == "team-a" and out["batch_id"] == "batch_123"
    for field in ("authorization", "api_key", "body"):
        assert field not in out
    assert key not in json.dumps(out)
    assert "whsec_***" in scrub("secret whsec_" + "b" * 32)
    # H1: a signed link or a pre-signed S3 URL in any message loses its signature.
    link = "https://api.example/v1/nightbatch/files/file-1/download?expires=1700000000&sig=AbC-_9xyz"
    assert scrub(f"sent {link} ok") == "sent " + link.replace("AbC-_9xyz", "***") + " ok"
    presigned = "https://b.s3.amazonaws.com/k?X-Amz-Credential=x&X-Amz-Signature=deadbeef&X-Amz-Security-Token=tok"
    assert "deadbeef" not in scrub(presigned) and "tok" not in scrub(presigned).split("Token=")[1]
    try:
        raise ValueError(f"bad key {key}")
    except ValueError:
        import sys

        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    out = json.loads(fmt.format(record))
    assert "ValueError" in out["exception"] and key not in out["exception"]


def test_a_traced_lambda_s_lines_carry_the_trace_id(monkeypatch: pytest.MonkeyPatch) -> None:
    record = logging.LogRecord("nightbatch.test", logging.INFO, __file__, 1, "step done", (), None)
    assert "xray_trace_id" not in json.loads(JsonFormatter().format(record))
    monkeypatch.setenv("_X_AMZN_TRACE_ID", "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1")
    assert json.loads(JsonFormatter().format(record))["xray_trace_id"] == "1-5759e988-bd862e3fe1be46a994272793"


def test_s3_keys_are_built_from_ids_not_user_strings(make_stack: Any) -> None:
    stack: Stack = make_stack(workflow="local")
    client = stack.client(stack.new_key("team-a"))
    evil = ["../../etc/passwd", "a/b/c.jsonl", "..", "%2e%2e%2fx", "EVILNAME\u0444.jsonl", "x\\y.jsonl"]
    ids = []
    for name in evil:
        f = client.files.create(file=(name, chat_lines(2, prefix="EVILCUSTOM/../id")), purpose="batch")
        assert f.filename == name  # kept as metadata, as given
        ids.append(f.id)
    data = chat_lines(3, prefix="EVILCUSTOM/../up")
    upload = client.uploads.upload_file_chunked(file=data, filename="../../EVILUPLOAD.jsonl", bytes=len(data),
                                                mime_type="application/jsonl", purpose="batch", part_size=100)
    ids += [upload.id, upload.file.id]
    batch = client.batches.create(input_file_id=ids[0], endpoint="/v1/chat/completions",
                                  completion_window="24h", metadata={"path": "../../EVILMETA"})
    wait_for(lambda: client.batches.retrieve(batch.id).status in ("completed", "failed"))
    s3 = stack.services.adapters.client("s3")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=stack.settings.deployment.bucket).get("Contents", [])]
    assert keys
    for k in keys:
        assert re.fullmatch(r"[A-Za-z0-9_.\-/]+", k), k
        assert all(part not in ("", ".", "..") for part in k.split("/")), k
        assert not re.search(r"EVIL|passwd|%2e|\\\\", k, re.IGNORECASE), k
        assert any(i in k for i in [*ids, batch.id]), k  # every object is named after an id we minted
