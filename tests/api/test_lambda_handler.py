"""The API Lambda entry point (`functions.api.handler.handler`, Mangum) with API Gateway HTTP API v2 events.

The event template is tests/api/http_api_v2.json; the handler builds its services from NIGHTBATCH_*
settings and reaches moto's server through AWS_ENDPOINT_URL, as the deployed Lambda reaches AWS.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from urllib3.filepost import encode_multipart_formdata

from functions.api.app import default_services
from nightbatch.aws import Adapters
from nightbatch.aws.records import WebhookEndpointRecord
from nightbatch.settings import get_settings

EVENT = json.loads((Path(__file__).parent / "http_api_v2.json").read_text())
KEY = "nb-lambda-key"


def event(method: str, path: str, *, body: bytes | None = None, headers: dict[str, str] | None = None,
          query: str = "") -> dict[str, Any]:
    e = copy.deepcopy(EVENT)
    e["rawPath"] = path
    e["rawQueryString"] = query
    e["requestContext"]["http"].update(method=method, path=path)
    e["headers"]["authorization"] = f"Bearer {KEY}"
    e["headers"].update(headers or {})
    if body is not None:
        # HTTP APIs base64-encode binary bodies (multipart always arrives this way).
        e["body"] = base64.b64encode(body).decode()
        e["isBase64Encoded"] = True
        e["headers"]["content-length"] = str(len(body))
    return e


def body_of(resp: dict[str, Any]) -> bytes:
    raw = resp.get("body") or ""
    return base64.b64decode(raw) if resp.get("isBase64Encoded") else raw.encode()


@pytest.fixture
def handler(
    fresh_aws: Callable[..., Adapters], monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[dict[str, Any], Any], dict[str, Any]]]:
    adapters = fresh_aws()
    state_machine = adapters.stepfunctions.create_state_machine(
        name=adapters.settings.deployment.table, roleArn="arn:aws:iam::123456789012:role/sfn",
        definition=json.dumps({"StartAt": "Done", "States": {"Done": {"Type": "Pass", "End": True}}}),
    )["stateMachineArn"]
    monkeypatch.setenv("NIGHTBATCH_STATE_MACHINE_ARN", state_machine)
    monkeypatch.setenv("NIGHTBATCH_BUCKET", adapters.settings.deployment.bucket)
    monkeypatch.setenv("NIGHTBATCH_TABLE", adapters.settings.deployment.table)
    monkeypatch.setenv("NIGHTBATCH_API_KEY", KEY)
    monkeypatch.setenv("NIGHTBATCH_REGION", adapters.settings.deployment.region)
    from functions.api.handler import handler as lambda_handler

    # The Lambda reads its settings once per cold start; each test is a cold start.
    get_settings.cache_clear()
    default_services.cache_clear()
    yield lambda_handler
    get_settings.cache_clear()
    default_services.cache_clear()


def test_multipart_upload_through_api_gateway(handler: Any, make_jsonl: Callable[..., bytes]) -> None:
    data = make_jsonl(3)
    body, content_type = encode_multipart_formdata(
        [("purpose", "batch"), ("file", ("batch_requests.jsonl", data, "application/jsonl"))]
    )
    resp = handler(event("POST", "/v1/files", body=body, headers={"content-type": content_type}), None)

    assert resp["statusCode"] == 200, resp
    assert resp["headers"]["content-type"] == "application/json"
    assert resp["headers"]["x-request-id"].startswith("req_")
    f = json.loads(body_of(resp))
    assert f["object"] == "file"
    assert f["id"].startswith("file-")
    assert (f["bytes"], f["filename"], f["purpose"], f["status"]) == (
        len(data), "batch_requests.jsonl", "batch", "processed"
    )

    # The same Lambda serves the bytes back and the batch create.
    got = handler(event("GET", f"/v1/files/{f['id']}/content"), None)
    assert got["statusCode"] == 200
    assert body_of(got) == data
    create = json.dumps({"input_file_id": f["id"], "endpoint": "/v1/chat/completions",
                         "completion_window": "24h"}).encode()
    made = handler(event("POST", "/v1/batches", body=create, headers={"content-type": "application/json"}), None)
    assert made["statusCode"] == 200, made
    batch = json.loads(body_of(made))
    assert batch["status"] == "validating"
    sfn = get_settings()
    executions = default_services().adapters.stepfunctions.list_executions(
        stateMachineArn=sfn.pipeline.state_machine_arn)["executions"]
    assert [e["name"] for e in executions] == [batch["id"]]  # one execution, named after the batch
    listed = handler(event("GET", "/v1/files", query="limit=1&order=asc"), None)
    assert [x["id"] for x in json.loads(body_of(listed))["data"]] == [f["id"]]


def test_errors_through_api_gateway(handler: Any) -> None:
    resp = handler(event("GET", "/v1/batches/batch_nope"), None)
    assert resp["statusCode"] == 404
    assert resp["headers"]["x-request-id"].startswith("req_")
    assert set(json.loads(body_of(resp))["error"]) == {"message", "type", "param", "code"}

    resp = handler(event("GET", "/v1/files", headers={"authorization": "Bearer wrong"}), None)
    assert resp["statusCode"] == 401
    assert json.loads(body_of(resp))["error"]["code"] == "invalid_api_key"


def test_no_schema_or_docs_pages_in_aws(handler: Any) -> None:
    """L9: the deployed API publishes no route map and serves no page that loads third-party scripts."""
    for path in ("/openapi.json", "/docs", "/redoc", "/docs/oauth2-redirect"):
        resp = handler(event("GET", path), None)
        assert resp["statusCode"] == 404, path
        assert json.loads(body_of(resp))["error"]["message"] == f"Invalid URL (GET {path})"
    page = body_of(handler(event("GET", "/dashboard"), None)).decode()
    assert "<script src" not in page and "cdn" not in page.lower()


def test_unauthenticated_requests_cost_no_table_or_s3_call(handler: Any) -> None:
    """M5: junk credentials are refused before any DynamoDB or S3 request (only key-shaped keys are looked up)."""
    assert handler(event("GET", "/v1/batches"), None)["statusCode"] == 200  # cold start: services built
    calls: list[str] = []
    adapters = default_services().adapters
    for client in (adapters.table.table.meta.client, adapters.client("s3")):
        client.meta.events.register("before-call.*.*", lambda model, **kw: calls.append(model.name))
    adapters.blobs.client.meta.events.register("before-call.*.*", lambda model, **kw: calls.append(model.name))
    for auth in ("", "Bearer ", "Basic abc", "Bearer sk-not-ours", "Bearer nb-short", "Bearer " + "x" * 5000):
        resp = handler(event("GET", "/v1/files", headers={"authorization": auth}), None)
        assert resp["statusCode"] == 401, auth
    assert calls == []


def test_webhooks_test_is_queued_on_sqs_not_sent_by_the_api(handler: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """M5: the API Lambda only records the sample event and sends it to the webhook queue (Deliver posts it)."""
    adapters = default_services().adapters
    sqs = adapters.client("sqs")
    queue_url = sqs.create_queue(QueueName=f"{adapters.settings.deployment.table}-webhooks")["QueueUrl"]
    monkeypatch.setenv("NIGHTBATCH_WEBHOOK_QUEUE_URL", queue_url)
    get_settings.cache_clear()
    default_services.cache_clear()
    table = default_services().adapters.table
    # A public https receiver that must never be called from here (its host does not even resolve).
    table.put_record(WebhookEndpointRecord(pk="whep_lambda", tenant="default", created_at=1, event_types=[
        "batch.completed"], name="x", url="https://receiver.invalid/hook", secret="whsec_" + "a" * 32), new=True)

    resp = handler(event("POST", "/v1/webhook_endpoints/whep_lambda/test",
                         body=b'{"event_type": "batch.completed"}',
                         headers={"content-type": "application/json"}), None)
    assert resp["statusCode"] == 202, body_of(resp)
    result = json.loads(body_of(resp))
    assert (result["object"], result["status"], result["webhook_endpoint_id"]) == (
        "webhook_endpoint.test", "pending", "whep_lambda")
    (message,) = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10)["Messages"]
    assert json.loads(message["Body"])["delivery_id"] == result["delivery_id"]
    listed = json.loads(body_of(handler(event("GET", "/v1/nightbatch/webhook_endpoints/whep_lambda/deliveries"),
                                        None)))["data"]
    assert [(d["id"], d["status"], d["test"], d["attempts"]) for d in listed] == [
        (result["delivery_id"], "pending", True, [])]
