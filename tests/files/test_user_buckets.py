# ruff: noqa: F811  (the `services` fixture is imported from tests/support/pipeline_world.py, then requested)
"""Batches over the users' own buckets (nightbatch/files/user_buckets.py): the input read in place from an
allow-listed `s3://` object or prefix (no byte of it copied), the output and error files copied under an
allow-listed `s3://` prefix. Moto buckets of the same in-process moto stand in for the user's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from nightbatch.aws.records import BatchRecord
from nightbatch.batches.service import CreateBatchRequest
from nightbatch.errors import InvalidRequestError
from nightbatch.pipeline import BatchTaskInput, finalize_batch
from nightbatch.wiring import Services
from tests.pipeline.test_pipeline import read_file, run_to_shards, write_results
from tests.support.pipeline_world import (
    chat_line,
    jsonl,
    services,  # noqa: F401  (the pipeline's world on moto)
)

USER = "users-data"
OUT = "users-results"
OBJECTS = {  # three JSONL objects under one prefix, in key order; the others are not the input
    "prompts/a.jsonl": jsonl([chat_line(i) for i in range(0, 10)]),
    "prompts/b.jsonl": jsonl([chat_line(i) for i in range(10, 25)]),
    "prompts/c.jsonl": jsonl([chat_line(i) for i in range(25, 31)]),
}


@pytest.fixture
def user_bucket(services: Services) -> Any:
    s3 = services.adapters.client("s3")
    for bucket in (USER, OUT, "not-listed"):
        s3.create_bucket(Bucket=bucket)
    for key, data in OBJECTS.items():
        s3.put_object(Bucket=USER, Key=key, Body=data)
    s3.put_object(Bucket=USER, Key="prompts/", Body=b"")  # a console "folder"
    s3.put_object(Bucket=USER, Key="prompts-old/z.jsonl", Body=jsonl([chat_line(99)]))
    s3.put_object(Bucket="not-listed", Key="p.jsonl", Body=OBJECTS["prompts/a.jsonl"])
    services.settings.files.user_input_buckets = f"{USER}, other"
    services.settings.files.user_output_prefixes = f"s3://{OUT}/nightly/"
    return s3


@contextmanager
def writes(services: Services) -> Iterator[list[tuple[str, str, int]]]:
    """(operation, bucket/key, body bytes) of every S3 write made meanwhile, seen on the real client."""
    seen: list[tuple[str, str, int]] = []

    def record(params: dict[str, Any], model: Any, **_: Any) -> None:
        body = params.get("Body", b"")
        if isinstance(body, str):
            body = body.encode()
        if not isinstance(body, bytes | bytearray):  # a stream: its length from where it stands
            at = body.tell()
            size = body.seek(0, 2) - at
            body.seek(at)
        else:
            size = len(body)
        seen.append((model.name, f"{params['Bucket']}/{params['Key']}", size))

    events = services.adapters.blobs.client.meta.events
    ops = ("PutObject", "UploadPart", "CopyObject", "UploadPartCopy", "CompleteMultipartUpload")
    for op in ops:
        events.register(f"provide-client-params.s3.{op}", record)
    try:
        yield seen
    finally:
        for op in ops:
            events.unregister(f"provide-client-params.s3.{op}", record)


def create(services: Services, **options: Any) -> str:
    return services.batches.create("default", CreateBatchRequest(
        endpoint="/v1/chat/completions", completion_window="24h", nightbatch=options)).id


def run(services: Services, batch_id: str) -> BatchRecord:
    for shard in run_to_shards(services, batch_id):
        write_results(services, batch_id, shard, fail_every=7)
    finalize_batch(BatchTaskInput(batch_id=batch_id), services)
    rec = services.adapters.table.get_record(BatchRecord, batch_id)
    assert rec is not None
    return rec


def test_a_prefix_of_several_objects_is_read_in_place(services: Services, user_bucket: Any) -> None:
    services.settings.pipeline.shard_target_tokens = 60
    total = sum(map(len, OBJECTS.values()))
    with writes(services) as seen:
        batch_id = create(services, input_uri=f"s3://{USER}/prompts/")
        shards = run_to_shards(services, batch_id)
    # Nothing of the input was copied: no write outside the batch's own index and plan, none to the user's bucket,
    # no server-side copy, and the line indexes a few bytes a line (each line's custom_id, range and estimate).
    assert len(shards) > 1
    assert all(key.startswith(f"{services.settings.deployment.bucket}/batches/{batch_id}/")
               for _, key, _ in seen), seen
    assert not [op for op, _, _ in seen if "Copy" in op]
    assert sum(n for _, key, n in seen if ".idx." in key) < total / 4
    rec = services.adapters.table.get_record(BatchRecord, batch_id)
    assert rec is not None
    # OpenAI's file object: the URI as its filename, the objects' bytes; the batch object says where it reads.
    f = services.files.get("default", rec.input_file_id)
    assert (f.purpose, f.filename, f.bytes, f.status) == ("batch", f"s3://{USER}/prompts/", total, "processed")
    assert services.batches.get("default", batch_id).nightbatch == {"input_uri": f"s3://{USER}/prompts/"}
    for shard in shards:
        write_results(services, batch_id, shard, fail_every=7)
    finalize_batch(BatchTaskInput(batch_id=batch_id), services)
    done = services.batches.get("default", batch_id)
    assert done.status == "completed" and done.request_counts.total == 31
    got = read_file(services, done.output_file_id) + read_file(services, done.error_file_id)
    assert sorted(int(x["custom_id"].split("-")[1]) for x in got) == list(range(31))  # not prompts-old/
    # Deleting the file deletes our item, never the user's objects.
    services.files.delete("default", rec.input_file_id)
    assert sorted(o["Key"] for o in user_bucket.list_objects_v2(Bucket=USER, Prefix="prompts/")["Contents"]) == [
        "prompts/", *OBJECTS]


def test_one_object_is_read_in_place(services: Services, user_bucket: Any) -> None:
    batch_id = create(services, input_uri=f"s3://{USER}/prompts/b.jsonl")
    rec = run(services, batch_id)
    assert rec.status == "completed"
    got = read_file(services, rec.output_file_id) + read_file(services, rec.error_file_id)
    assert sorted(int(x["custom_id"].split("-")[1]) for x in got) == list(range(10, 25))


@pytest.mark.parametrize(("options", "message"), [
    ({"input_uri": "s3://not-listed/p.jsonl"}, "is not under a location"),
    ({"input_uri": "https://users-data/p.jsonl"}, "expected an 's3://bucket/key' URI"),
    ({"input_uri": f"s3://{USER}/nothing/"}, "no non-empty object"),
    ({"input_uri": f"s3://{USER}/prompts/a.jsonl", "output_uri": f"s3://{OUT}/elsewhere/"}, "is not under"),
    ({"input_uri": f"s3://{USER}/prompts/a.jsonl", "output_uri": f"s3://{USER}/nightly/"}, "is not under"),
])
def test_a_uri_off_the_allow_list_is_a_400_naming_it(services: Services, user_bucket: Any,
                                                     options: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidRequestError) as e:
        create(services, **options)
    assert e.value.param == ("nightbatch.output_uri" if "output_uri" in options else "nightbatch.input_uri")
    assert message in str(e.value)


def test_input_file_id_and_input_uri_are_one_or_the_other(services: Services, user_bucket: Any) -> None:
    with pytest.raises(InvalidRequestError) as e:
        services.batches.create("default", CreateBatchRequest(
            input_file_id="file-x", endpoint="/v1/chat/completions", completion_window="24h",
            nightbatch={"input_uri": f"s3://{USER}/prompts/"}))
    assert e.value.param == "nightbatch.input_uri"
    with pytest.raises(InvalidRequestError) as e:
        services.batches.create("default", CreateBatchRequest(endpoint="/v1/chat/completions",
                                                              completion_window="24h"))
    assert e.value.param == "input_file_id"


def test_output_and_errors_land_under_the_users_prefix(services: Services, user_bucket: Any) -> None:
    batch_id = create(services, input_uri=f"s3://{USER}/prompts/", output_uri=f"s3://{OUT}/nightly/run-1")
    rec = run(services, batch_id)
    batch = services.batches.get("default", batch_id)
    where = f"s3://{OUT}/nightly/run-1/{batch_id}/"
    assert batch.nightbatch is not None and batch.nightbatch["output_uri"] == where
    assert "output_copy_error" not in batch.nightbatch
    listed = user_bucket.list_objects_v2(Bucket=OUT)["Contents"]
    assert sorted(o["Key"] for o in listed) == [f"nightly/run-1/{batch_id}/errors.jsonl",
                                               f"nightly/run-1/{batch_id}/output.jsonl"]
    for kind, file_id in (("output", rec.output_file_id), ("errors", rec.error_file_id)):
        body = user_bucket.get_object(Bucket=OUT, Key=f"nightly/run-1/{batch_id}/{kind}.jsonl")["Body"].read()
        item = services.files.item("default", file_id or "")
        assert body == b"".join(services.files.chunks(item))  # and still served through the Files API
        assert json.loads(body.splitlines()[0])["custom_id"].startswith("req-")


def test_a_refused_copy_is_said_on_the_batch_not_retried(services: Services, user_bucket: Any) -> None:
    batch_id = create(services, input_uri=f"s3://{USER}/prompts/a.jsonl", output_uri=f"s3://{OUT}/nightly/")
    user_bucket.delete_bucket(Bucket=OUT)  # gone meanwhile: S3 answers NoSuchBucket
    rec = run(services, batch_id)
    assert rec.status == "completed" and rec.output_file_id
    assert "NoSuchBucket" in (rec.ext or {})["output_copy_error"]


def test_a_prefix_over_the_object_cap_is_refused_after_one_page(services: Services, user_bucket: Any) -> None:
    """The API request lists at most one object past the cap (a million-object prefix listed in full was ~1,000
    list calls inside one request, past API Gateway's 29 s)."""
    services.settings.files.max_user_input_objects = 3
    for n in range(40):
        user_bucket.put_object(Bucket=USER, Key=f"many/{n:03d}.jsonl", Body=jsonl([chat_line(n)]))
    asked: list[int] = []
    listed: list[int] = []

    def before(params: dict[str, Any], **_: Any) -> None:
        asked.append(int(params.get("MaxKeys", 1000)))

    def after(parsed: dict[str, Any], **_: Any) -> None:
        listed.append(len(parsed.get("Contents", [])))

    events = services.adapters.blobs.client.meta.events
    events.register("provide-client-params.s3.ListObjectsV2", before)
    events.register("after-call.s3.ListObjectsV2", after)
    with pytest.raises(InvalidRequestError, match="holds more than 3 objects"):
        create(services, input_uri=f"s3://{USER}/many/")
    assert sum(listed) <= 4 and len(asked) == 1
