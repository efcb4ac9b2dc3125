"""Task functions chained like the state machine, on moto (in-process)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import pytest
from moto import mock_aws

from nightbatch.batches import CreateBatchRequest
from nightbatch.services import Services, build_services
from nightbatch.settings import Settings
from nightbatch.storage import make_adapters
from nightbatch.storage.dynamo import create_table


class RecordingWorkflow:
    """The workflow port's test implementation: records started batch ids; the test drives the steps."""

    def __init__(self) -> None:
        self.started: list[str] = []

    def start(self, batch_id: str) -> None:
        self.started.append(batch_id)


@pytest.fixture
def services(monkeypatch: pytest.MonkeyPatch) -> Iterator[Services]:
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.setenv(k, "testing")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        settings = Settings(deployment={"mode": "local", "bucket": "wf-bucket", "table": "wf-table"},
                            pipeline={"segment_max_lines": 7})
        adapters = make_adapters(settings)
        adapters.client("s3").create_bucket(Bucket=settings.deployment.bucket)
        create_table(adapters.client("dynamodb"), settings.deployment.table)
        yield build_services(adapters, RecordingWorkflow())


def chat_line(i: int, model: str = "SmolLM2-135M-Instruct", **body: Any) -> dict[str, Any]:
    b: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": f"question {i}"}]}
    b.update(body)
    return {"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions", "body": b}


def overridden(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """A copy of `base` with `over` applied; a value of `...` removes that key."""
    out = dict(base)
    for k, v in over.items():
        if v is ...:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def make_batch(services: Services, payload: bytes, endpoint: str = "/v1/chat/completions",
               tenant: str = "default", **kw: Any) -> str:
    f = services.files.create(tenant, filename="in.jsonl", purpose="batch", fileobj=io.BytesIO(payload),
                              size=len(payload))
    b = services.batches.create(tenant, CreateBatchRequest(input_file_id=f.id, endpoint=endpoint,
                                                           completion_window="24h", **kw))
    return b.id


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(x).encode() + b"\n" for x in lines)
