"""Every object a batch's shards read carries the input tag before the worker runs (layout.INPUT_TAGS): the worker's
role reads files/ and uploads/ only through it (infra/access.py), so an untagged object is one it cannot read."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from nightbatch import layout
from nightbatch.aws.records import BatchRecord, FileRecord
from nightbatch.batches.request import CreateBatchRequest
from nightbatch.files.inputs import input_source
from nightbatch.pipeline import BatchTaskInput, plan_batch, validate_batch
from nightbatch.pipeline import validate as validate_module
from nightbatch.shards.lines import shard_lines
from nightbatch.shards.spec import read_manifest, read_shard
from nightbatch.tenancy.scope import tenant_tags
from nightbatch.wiring import Services
from tests.support.pipeline_world import chat_line, make_batch, upload_in_parts

# What a batch's input carries once validated: the input tag, beside its tenant's tag it was stored with
# (tenancy/scope.py); before, or never validated: its tenant's tag only.
OWN = tenant_tags("default")
INPUT = {**layout.INPUT_TAGS, **OWN}
DATA = b"".join(json.dumps(chat_line(i)).encode() + b"\n" for i in range(30))


@contextmanager
def gets(services: Services) -> Iterator[list[str]]:
    """The keys of every S3 GET (and HEAD) made meanwhile, seen on the real client."""
    keys: list[str] = []

    def record(params: dict[str, Any], **_: Any) -> None:
        keys.append(params["Key"])

    events = services.adapters.blobs.client.meta.events
    for op in ("GetObject", "HeadObject"):
        events.register(f"provide-client-params.s3.{op}", record)
    try:
        yield keys
    finally:
        for op in ("GetObject", "HeadObject"):
            events.unregister(f"provide-client-params.s3.{op}", record)


def read_inputs(services: Services, batch_id: str) -> list[str]:
    """The files/ and uploads/ keys the batch's shards read, as the worker reads them."""
    blobs = services.adapters.blobs
    with gets(services) as keys:
        for item in read_manifest(blobs, batch_id):
            spec = read_shard(blobs, batch_id, item.shard_id)
            assert spec is not None
            assert list(shard_lines(blobs, spec))
    return [k for k in keys if k.startswith((layout.FILES_PREFIX, layout.UPLOADS_PREFIX))]


def tags(services: Services, key: str) -> dict[str, str]:
    return services.adapters.blobs.tags(key)


def test_validate_tags_the_input_and_nothing_else(services: Services) -> None:
    batch_id = make_batch(services, DATA)
    bystander = services.files.create("default", filename="ft.jsonl", purpose="fine-tune",
                                      fileobj=io.BytesIO(DATA), size=len(DATA))
    rec = services.adapters.table.get_record(BatchRecord, batch_id)
    assert rec is not None
    assert tags(services, layout.file_key(rec.input_file_id)) == OWN
    inp = BatchTaskInput(batch_id=batch_id)
    assert validate_batch(inp, services).valid
    assert tags(services, layout.file_key(rec.input_file_id)) == INPUT
    assert tags(services, layout.file_key(bystander.id)) == OWN
    plan_batch(inp, services)
    read = read_inputs(services, batch_id)
    assert read and all(tags(services, k) == INPUT for k in read)
    # A refused input has no shard to be read by: it stays untagged.
    refused = make_batch(services, DATA + b"{not json\n")
    refused_rec = services.adapters.table.get_record(BatchRecord, refused)
    assert refused_rec is not None
    assert not validate_batch(BatchTaskInput(batch_id=refused), services).valid
    assert tags(services, layout.file_key(refused_rec.input_file_id)) == OWN


def test_every_key_a_shard_reads_of_an_upload_is_tagged_before_and_after_composition(
        services: Services, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(services.uploads.jobs, "compose", lambda *a, **k: None)
    # A one-byte part among them.
    file_id, upload_id = upload_in_parts(services, DATA, [0, 1, 517, 518, 2000, len(DATA)])
    batch = services.batches.create("default", CreateBatchRequest(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"))
    inp = BatchTaskInput(batch_id=batch.id)
    assert validate_batch(inp, services).valid
    plan_batch(inp, services)
    read = read_inputs(services, batch.id)
    # Through the parts (not composed yet): every part the ranges touch, each tagged.
    assert {k for k in read if k.startswith(layout.UPLOADS_PREFIX)} == set(
        services.files.item("default", file_id).parts or [])
    assert all(tags(services, k) == INPUT for k in read), {k: tags(services, k) for k in read}
    # Composed later: the worker switches to the composed object, which carries the tag over.
    services.assembly.compose(file_id, upload_id)
    read = read_inputs(services, batch.id)
    assert read and set(read) == {layout.file_key(file_id)}
    assert tags(services, layout.file_key(file_id)) == INPUT


def test_composition_that_read_the_parts_untagged_still_tags_the_object(
        services: Services, monkeypatch: pytest.MonkeyPatch) -> None:
    """Validate tags the parts while composition writes the object (after it read the parts' tags, before it
    drops `parts` from the File): composition's second look after dropping them sees the tag."""
    monkeypatch.setattr(services.uploads.jobs, "compose", lambda *a, **k: None)
    file_id, upload_id = upload_in_parts(services, DATA, [0, 100, 900, len(DATA)])
    keys = services.files.item("default", file_id).parts or []

    def validate_meanwhile(**_: Any) -> None:
        for key in keys:
            services.adapters.blobs.tag(key, layout.INPUT_TAGS)

    events = services.adapters.blobs.client.meta.events
    events.register_first("before-call.s3.CreateMultipartUpload", validate_meanwhile)
    try:
        services.assembly.compose(file_id, upload_id)
    finally:
        events.unregister("before-call.s3.CreateMultipartUpload", validate_meanwhile)
    assert tags(services, keys[0]) == INPUT
    assert tags(services, layout.file_key(file_id)) == INPUT


def test_validate_that_saw_the_parts_tags_an_object_composed_meanwhile(
        services: Services, monkeypatch: pytest.MonkeyPatch) -> None:
    """The other order: composition finished (untagged parts) after Validate read the File with its parts."""
    monkeypatch.setattr(services.uploads.jobs, "compose", lambda *a, **k: None)
    file_id, upload_id = upload_in_parts(services, DATA, [0, 100, 900, len(DATA)])
    stale = services.adapters.table.get_record(FileRecord, file_id)
    assert stale is not None and stale.parts
    source = input_source(services.adapters.blobs, stale)
    services.assembly.compose(file_id, upload_id)
    assert tags(services, layout.file_key(file_id)) == OWN
    validate_module._mark_input(services, stale, source)
    assert tags(services, layout.file_key(file_id)) == INPUT


def test_an_input_rewritten_to_outlive_the_batch_keeps_the_tag(
        services: Services, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(layout, "OBJECT_EXPIRY_DAYS", 1)
    batch_id = make_batch(services, DATA)
    rec = services.adapters.table.get_record(BatchRecord, batch_id)
    assert rec is not None
    key = layout.file_key(rec.input_file_id)
    assert validate_batch(BatchTaskInput(batch_id=batch_id), services).valid
    blobs = services.adapters.blobs
    assert blobs.client.head_object(Bucket=blobs.bucket, Key=key)["Metadata"]["nightbatch-kept-for"] == batch_id
    assert tags(services, key) == INPUT


