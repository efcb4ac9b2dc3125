"""Task functions chained like the state machine, on moto (in-process)."""

from __future__ import annotations

import asyncio
import io
import itertools
import json
from collections.abc import Iterator
from typing import Any

import pytest
from moto import mock_aws

from gpu_worker.runner import ShardJob, run_shard
from nightbatch.aws import make_adapters
from nightbatch.aws.dynamo import create_table
from nightbatch.batches.request import CreateBatchRequest
from nightbatch.files.uploads import CompleteUploadRequest, CreateUploadRequest
from nightbatch.pipeline import BatchTaskInput, plan_batch, validate_batch
from nightbatch.settings import Settings
from nightbatch.shards.lines import shard_requests
from nightbatch.shards.spec import read_manifest, read_shard
from nightbatch.validation.line import RequestLine
from nightbatch.wiring import Services, build_services
from tests.support.deterministic_engine import DeterministicEngine


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


def shard_requests_of(services: Services, batch_id: str, shard_id: str) -> list[RequestLine]:
    """The requests of one planned shard, as the worker reads them."""
    spec = read_shard(services.adapters.blobs, batch_id, shard_id)
    assert spec is not None
    return list(shard_requests(services.adapters.blobs, spec))


def upload_in_parts(services: Services, data: bytes, cuts: list[int]) -> tuple[str, str]:
    """`data` as an Upload of parts cut at `cuts`, completed but not composed (composition runs minutes later in
    AWS): (file id, upload id)."""
    up = services.uploads.create("default", CreateUploadRequest(bytes=len(data), filename="in.jsonl",
                                                                mime_type="text/jsonl", purpose="batch"))
    parts = [services.uploads.add_part("default", up.id, io.BytesIO(data[a:b]), b - a).id
             for a, b in itertools.pairwise(cuts)]
    done = services.uploads.complete("default", up.id, CompleteUploadRequest(part_ids=parts))
    assert done.file is not None
    return done.file.id, up.id


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(x).encode() + b"\n" for x in lines)


def planned_shards(services: Services, n: int, *, segment_max_lines: int,
                   shard_target_tokens: int) -> tuple[str, list[tuple[str, list[str]]]]:
    """A validated and planned batch of n chat lines: its id, and each shard's id with its custom_ids in order."""
    services.settings.pipeline.segment_max_lines = segment_max_lines
    services.settings.pipeline.shard_target_tokens = shard_target_tokens
    batch_id = make_batch(services, jsonl([chat_line(i) for i in range(n)]))
    inp = BatchTaskInput(batch_id=batch_id)
    assert validate_batch(inp, services).valid
    plan_batch(inp, services)
    return batch_id, [(item.shard_id, [r.custom_id for r in shard_requests_of(services, batch_id, item.shard_id)])
                      for item in read_manifest(services.adapters.blobs, batch_id)]


def run_shards(services: Services, batch_id: str, model: str = "SmolLM2-135M-Instruct") -> None:
    """Plan (Validate has run), then every shard to its end on the deterministic engine, as the workflow's Map."""
    plan_batch(BatchTaskInput(batch_id=batch_id), services)
    spec = services.settings.serving.model(model)
    assert spec is not None
    for item in read_manifest(services.adapters.blobs, batch_id):
        report = asyncio.run(run_shard(ShardJob(batch_id=batch_id, shard_id=item.shard_id),
                                       engine=DeterministicEngine(spec), blobs=services.adapters.blobs,
                                       table=services.adapters.table, settings=services.settings))
        assert report.finished
