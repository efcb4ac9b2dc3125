"""Finalize's and the sweeper's roles cover every object their code touches. The real code runs on moto, every S3
call it makes is recorded on its client, and each call is evaluated against the role's synthesized policy (moto
evaluates no IAM), as test_least_privilege.py reads the worker's:

- Finalize of a batch cancelled right after its Upload completed: Validate saw the Upload's parts (composition
  had not run yet). Finalize names the unrun lines from the line index (their custom_ids are in it) and reads no
  input; a line index of version 2 without ids (0.1.x's) is read through the input, here the parts under
  uploads/, which the role may read;
- the sweeper finalizing such a batch once its window has passed, and expiring an abandoned Upload (its parts
  deleted).
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from nightbatch import layout
from nightbatch.aws.records import UploadRecord
from nightbatch.batches.request import CreateBatchRequest
from nightbatch.clock import now
from nightbatch.files.uploads import CompleteUploadRequest, CreateUploadRequest
from nightbatch.pipeline import BatchTaskInput, finalize_batch, plan_batch, validate_batch
from nightbatch.pipeline.sweep import sweep
from nightbatch.wiring import Services
from tests.infra.cfn import of_type
from tests.infra.iam_eval import allows, role_of_handler, statements_of_role
from tests.support.pipeline_world import chat_line

DATA = b"".join(json.dumps(chat_line(i)).encode() + b"\n" for i in range(12))
# Each S3 operation the code may call, as the IAM action it needs on the object (or the bucket, for listings).
OBJECT_ACTIONS = {
    "GetObject": "s3:GetObject", "HeadObject": "s3:GetObject", "PutObject": "s3:PutObject",
    "CreateMultipartUpload": "s3:PutObject", "UploadPart": "s3:PutObject", "UploadPartCopy": "s3:PutObject",
    "CompleteMultipartUpload": "s3:PutObject", "CopyObject": "s3:PutObject", "DeleteObject": "s3:DeleteObject",
    "AbortMultipartUpload": "s3:AbortMultipartUpload", "ListParts": "s3:ListMultipartUploadParts",
    "GetObjectTagging": "s3:GetObjectTagging", "PutObjectTagging": "s3:PutObjectTagging",
}
BUCKET_ACTIONS = {"ListObjectsV2": "s3:ListBucket", "ListObjects": "s3:ListBucket",
                  "ListMultipartUploads": "s3:ListBucketMultipartUploads"}


@dataclass(frozen=True)
class Access:
    action: str
    resource: str  # an object's or the bucket's ARN
    context: tuple[tuple[str, str], ...] = ()  # condition keys of the request (s3:prefix of a listing)


def accesses(operation: str, params: dict[str, Any]) -> list[Access]:
    """What one S3 call needs of IAM."""
    bucket = f"arn:aws:s3:::{params['Bucket']}"
    if operation in BUCKET_ACTIONS:
        return [Access(BUCKET_ACTIONS[operation], bucket, (("s3:prefix", params.get("Prefix", "")),))]
    if operation == "DeleteObjects":
        return [Access("s3:DeleteObject", f"{bucket}/{o['Key']}") for o in params["Delete"]["Objects"]]
    assert operation in OBJECT_ACTIONS, f"S3 {operation}: map it to the IAM action it needs"
    needed = [Access(OBJECT_ACTIONS[operation], f"{bucket}/{params['Key']}")]
    source = params.get("CopySource")
    if source:
        needed.append(Access("s3:GetObject", f"arn:aws:s3:::{source['Bucket']}/{source['Key']}"))
    if params.get("Tagging") or params.get("TaggingDirective") == "REPLACE":
        needed.append(Access("s3:PutObjectTagging", f"{bucket}/{params['Key']}"))
    return needed


@contextmanager
def recorded(services: Services) -> Iterator[list[Access]]:
    """Every S3 call made meanwhile on the deployment's client, as the IAM accesses it needs."""
    seen: list[Access] = []

    def record(params: dict[str, Any], model: Any, **_: Any) -> None:
        seen.extend(accesses(model.name, params))

    events = services.adapters.blobs.client.meta.events
    events.register("provide-client-params.s3", record)
    try:
        yield seen
    finally:
        events.unregister("provide-client-params.s3", record)


def uncomposed_upload(services: Services, tenant: str = "default") -> str:
    """A completed Upload whose composition has not run yet (it runs minutes later in AWS): its file id."""
    up = services.uploads.create(tenant, CreateUploadRequest(bytes=len(DATA), filename="in.jsonl",
                                                             mime_type="text/jsonl", purpose="batch"))
    parts = [services.uploads.add_part(tenant, up.id, io.BytesIO(DATA[a:b]), b - a).id
             for a, b in ((0, 700), (700, 1500), (1500, len(DATA)))]
    done = services.uploads.complete(tenant, up.id, CompleteUploadRequest(part_ids=parts))
    assert done.file is not None
    return done.file.id


def validated_batch(services: Services) -> str:
    batch = services.batches.create("default", CreateBatchRequest(
        input_file_id=uncomposed_upload(services), endpoint="/v1/chat/completions", completion_window="24h"))
    inp = BatchTaskInput(batch_id=batch.id)
    assert validate_batch(inp, services).valid
    plan_batch(inp, services)
    return batch.id


@pytest.fixture
def no_composition(services: Services, monkeypatch: pytest.MonkeyPatch) -> Services:
    monkeypatch.setattr(services.uploads.jobs, "compose", lambda *a, **k: None)
    return services


def denied(template: dict[str, Any], handler: str, seen: list[Access], bucket: str) -> list[Access]:
    (bucket_id,) = of_type(template, "AWS::S3::Bucket")
    statements = statements_of_role(template, role_of_handler(template, handler))
    arns = {bucket_id: f"arn:aws:s3:::{bucket}"}
    return sorted({a for a in seen if not allows(statements, a.action, a.resource, dict(a.context), arns)},
                  key=lambda a: (a.action, a.resource))


def test_finalize_may_read_a_cancelled_batch_s_input_through_its_upload_s_parts(
        template: dict[str, Any], no_composition: Services) -> None:
    services = no_composition
    batch_id = validated_batch(services)
    services.batches.cancel("default", batch_id)
    with recorded(services) as seen:
        assert finalize_batch(BatchTaskInput(batch_id=batch_id), services).status == "cancelled"
    bucket = services.adapters.blobs.bucket
    assert seen and denied(template, "functions.tasks.finalize.handler", seen, bucket) == []
    statements = statements_of_role(template, role_of_handler(template, "functions.tasks.finalize.handler"))
    (bucket_id,) = of_type(template, "AWS::S3::Bucket")
    part = f"arn:aws:s3:::{bucket}/{layout.UPLOADS_PREFIX}upload_x/parts/part_1"
    assert allows(statements, "s3:GetObject", part, {}, {bucket_id: f"arn:aws:s3:::{bucket}"})


def test_the_sweeper_may_finalize_such_a_batch_and_expire_an_abandoned_upload(
        template: dict[str, Any], no_composition: Services) -> None:
    services = no_composition
    batch_id = validated_batch(services)
    services.adapters.table.update(batch_id, set_={"expires_at": 1})
    abandoned = services.uploads.create("default", CreateUploadRequest(bytes=len(DATA), filename="a.jsonl",
                                                                       mime_type="text/jsonl", purpose="batch"))
    services.uploads.add_part("default", abandoned.id, io.BytesIO(DATA), len(DATA))
    services.adapters.table.update(abandoned.id, set_={"expires_at": now() - 1})
    with recorded(services) as seen:
        report = sweep(services)
    assert report["finalized"] == [batch_id] and report["expired_uploads"] == [abandoned.id]
    record = services.adapters.table.get_record(UploadRecord, abandoned.id)
    assert record is not None and record.status == "expired"
    bucket = services.adapters.blobs.bucket
    uploads = {a.action for a in seen if f"/{layout.UPLOADS_PREFIX}" in a.resource}
    assert "s3:DeleteObject" in uploads, uploads
    assert denied(template, "functions.tasks.sweep.handler", seen, bucket) == []
