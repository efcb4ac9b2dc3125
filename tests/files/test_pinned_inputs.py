"""Inputs are pinned (nightbatch/files/inputs.py): every read of a batch's input, from Validate to the content route,
reads the version accepted when its file was made, and an input that changed, went or became unreadable ends each
affected line once, as an error line saying so with its line number (or fails the batch at Validate with that
code): `request_counts.total` never changes after Validate, and every batch ends.

The real chain on moto's server: the API (real HTTP, the stock OpenAI SDK for the content route), Validate, Plan,
the shard runner on the deterministic engine, Finalize. Four input paths (an in-place object, an in-place prefix,
an uploaded file, an Upload read through its parts) and five mutations of one of their objects (overwritten at
the same size with a custom_id duplicated, shrunk, grown, deleted, its GET denied by a bucket policy), made
before Validate or between Validate and the worker.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import openai
import pytest
from openai import OpenAI

from nightbatch import layout
from nightbatch.aws.records import BatchRecord, FileRecord
from nightbatch.batches.request import CreateBatchRequest
from nightbatch.errors import ConflictError
from nightbatch.files.inputs import KEPT_ETAGS, InputReader
from nightbatch.files.sources import InputSource
from nightbatch.files.uploads import CompleteUploadRequest, CreateUploadRequest
from nightbatch.jsonl import BOM
from nightbatch.pipeline import BatchTaskInput, finalize_batch, plan_batch, validate_batch
from nightbatch.results.partial import partial_results
from nightbatch.results.retry import RetryRequest, retry_batch
from nightbatch.wiring import Services
from tests.conftest import unique_name
from tests.support.pipeline_world import run_shards

if TYPE_CHECKING:
    from tests.conftest import ApiServer

MODEL = "SmolLM2-135M-Instruct"
URL = "/v1/chat/completions"
PATHS = ("object", "prefix", "upload", "parts")
MUTATIONS = ("same_size", "shrink", "grow", "delete", "denied")


def line(custom_id: str, text: str = "hi") -> bytes:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": URL, "body": {
        "model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 4}}).encode()


def doc(ids: list[str]) -> bytes:
    return b"".join(line(c) + b"\n" for c in ids)


@dataclass
class Input:
    """A batch input made one way: how to create the batch, and the one object the test changes."""

    create: dict[str, Any]  # CreateBatchRequest fields naming the input
    ids: list[str]          # every custom_id, in input order
    bucket: str             # the object the mutation changes, and the custom_ids of its lines
    key: str
    changed_ids: list[str]
    data: bytes             # that object's bytes as accepted


@dataclass
class World:
    api: ApiServer
    services: Services
    s3: Any
    user_bucket: str

    def make(self, path: str) -> Input:
        services, s3, bucket = self.services, self.s3, self.user_bucket
        tag = unique_name("r")
        ids = [f"{tag}-{i}" for i in range(9 if path == "prefix" else 6)]
        if path == "object":
            s3.put_object(Bucket=bucket, Key="in/one.jsonl", Body=doc(ids))
            return Input({"nightbatch": {"input_uri": f"s3://{bucket}/in/one.jsonl"}}, ids, bucket, "in/one.jsonl",
                         ids, doc(ids))
        if path == "prefix":
            for name, part in zip("abc", (ids[:3], ids[3:6], ids[6:]), strict=True):
                s3.put_object(Bucket=bucket, Key=f"in/{name}.jsonl", Body=doc(part))
            return Input({"nightbatch": {"input_uri": f"s3://{bucket}/in/"}}, ids, bucket, "in/b.jsonl", ids[3:6],
                         doc(ids[3:6]))
        deployment = services.settings.deployment.bucket
        if path == "upload":
            f = services.files.create("default", filename="in.jsonl", purpose="batch", fileobj=io.BytesIO(doc(ids)),
                                      size=len(doc(ids)))
            return Input({"input_file_id": f.id}, ids, deployment, layout.file_key(f.id), ids, doc(ids))
        # An Upload of three parts, each two whole lines, read through its parts: composition has not run.
        services.uploads.jobs.compose = lambda *a, **k: None  # this test's own services: nothing to restore
        pieces = [doc(ids[0:2]), doc(ids[2:4]), doc(ids[4:6])]
        up = services.uploads.create("default", CreateUploadRequest(bytes=sum(map(len, pieces)), filename="in.jsonl",
                                                                    mime_type="text/jsonl", purpose="batch"))
        part_ids = [services.uploads.add_part("default", up.id, io.BytesIO(p), len(p)).id for p in pieces]
        done = services.uploads.complete("default", up.id, CompleteUploadRequest(part_ids=part_ids))
        assert done.file is not None
        rec = services.files.item("default", done.file.id)
        assert rec.parts and len(rec.parts) == 3
        return Input({"input_file_id": done.file.id}, ids, deployment, rec.parts[1], ids[2:4], pieces[1])

    def mutate(self, inp: Input, mutation: str) -> str:
        """Changes the input's object; returns the code its lines must end with."""
        s3, bucket, key, data = self.s3, inp.bucket, inp.key, inp.data
        if mutation == "same_size":  # the rewrite: as long, one custom_id now twice
            last, before = inp.changed_ids[-1], inp.changed_ids[-2]
            assert len(last) == len(before)
            s3.put_object(Bucket=bucket, Key=key, Body=data.replace(last.encode(), before.encode()))
        elif mutation == "shrink":
            s3.put_object(Bucket=bucket, Key=key, Body=data[:data.rindex(b"\n", 0, len(data) - 1) + 1])
        elif mutation == "grow":
            s3.put_object(Bucket=bucket, Key=key, Body=data + line("more") + b"\n")
        elif mutation == "delete":
            s3.delete_object(Bucket=bucket, Key=key)
        else:  # a bucket policy denies reading it (S3 answers 403 AccessDenied)
            s3.put_bucket_policy(Bucket=bucket, Policy=json.dumps({"Version": "2012-10-17", "Statement": [{
                "Effect": "Deny", "Principal": "*", "Action": "s3:GetObject",
                "Resource": f"arn:aws:s3:::{bucket}/{key}"}]}))
            return "input_unreadable"
        return "input_changed"

    def create(self, inp: Input) -> str:
        return self.services.batches.create("default", CreateBatchRequest(
            endpoint=URL, completion_window="24h", **inp.create)).id

    def run(self, batch_id: str) -> BatchRecord:
        """Plan, every shard on the deterministic engine, Finalize (Validate has run)."""
        services = self.services
        inp = BatchTaskInput(batch_id=batch_id)
        run_shards(services, batch_id, MODEL)
        # While it is open, the partial results hold every line once already (an input's error lines among them).
        streamed = [json.loads(x)["custom_id"] for kind in ("output", "error")
                    for x in partial_results(services, "default", batch_id, kind).lines]
        assert len(streamed) == len(set(streamed)) == self.batch(batch_id).request_counts["total"]
        finalize_batch(inp, services)
        return self.batch(batch_id)

    def batch(self, batch_id: str) -> BatchRecord:
        rec = self.services.adapters.table.get_record(BatchRecord, batch_id)
        assert rec is not None
        return rec

    def lines(self, file_id: str | None) -> list[dict[str, Any]]:
        if file_id is None:
            return []
        data = b"".join(self.services.files.chunks(self.services.files.item("default", file_id)))
        return [json.loads(x) for x in data.splitlines()]


@pytest.fixture
def world(api_server: ApiServer) -> World:
    services = api_server.services
    s3 = services.adapters.blobs.client
    bucket = unique_name("users-data")
    s3.create_bucket(Bucket=bucket)
    services.settings.files.user_input_buckets = bucket
    return World(api_server, services, s3, bucket)


def ended_once(world: World, rec: BatchRecord, ids: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The batch's output and error lines by custom_id, each accepted custom_id in exactly one of them, and the
    counts those of Validate."""
    out, err = world.lines(rec.output_file_id), world.lines(rec.error_file_id)
    assert sorted(x["custom_id"] for x in out + err) == sorted(ids)
    assert rec.request_counts == {"total": len(ids), "completed": len(out), "failed": len(err)}
    return {x["custom_id"]: x for x in out}, {x["custom_id"]: x for x in err}


@pytest.mark.parametrize("mutation", MUTATIONS)
@pytest.mark.parametrize("path", PATHS)
def test_an_input_changed_after_validate_ends_its_lines_once_with_the_reason(
        world: World, path: str, mutation: str) -> None:
    """The issue's findings: a same-size rewrite with a duplicated custom_id completed with 5 of 6 lines and
    `total` rewritten 6 -> 5; a shrunk object failed the batch after three Finalize attempts with no output file;
    a deleted or denied object had Finalize re-raise NoSuchKey for good, the batch `finalizing` for ever."""
    inp = world.make(path)
    batch_id = world.create(inp)
    assert validate_batch(BatchTaskInput(batch_id=batch_id), world.services).valid
    assert world.batch(batch_id).request_counts["total"] == len(inp.ids)
    code = world.mutate(inp, mutation)
    rec = world.run(batch_id)
    assert rec.status == "completed"
    ok, failed = ended_once(world, rec, inp.ids)
    # The changed object's lines end with the reason (an Upload's parts are one file: from the first line the
    # changed part holds to the end of the lines read with it); every line before it ran.
    first = inp.ids.index(inp.changed_ids[0])
    assert set(inp.changed_ids) <= set(failed)
    assert set(inp.ids[:first]) <= set(ok)
    if path != "parts":
        assert set(ok) == set(inp.ids) - set(inp.changed_ids)
    for custom_id, x in failed.items():
        assert x["response"] is None and x["error"]["code"] == code
        assert f"Line {inp.ids.index(custom_id) + 1} was not run" in x["error"]["message"]


@pytest.mark.parametrize("mutation", MUTATIONS)
@pytest.mark.parametrize("path", PATHS)
def test_an_input_changed_before_validate_fails_the_batch_naming_it(world: World, path: str, mutation: str) -> None:
    inp = world.make(path)
    batch_id = world.create(inp)
    code = world.mutate(inp, mutation)
    assert not validate_batch(BatchTaskInput(batch_id=batch_id), world.services).valid
    rec = world.batch(batch_id)
    assert rec.status == "failed"
    [error] = (rec.errors or {})["data"]
    assert error["code"] == code
    name = f"s3://{inp.bucket}/{inp.key}" if path in ("object", "prefix") else inp.key
    assert name in error["message"]
    assert finalize_batch(BatchTaskInput(batch_id=batch_id), world.services).status == "failed"


@pytest.mark.parametrize("path", ["object", "prefix", "upload"])
def test_unrun_lines_of_a_deleted_input_end_in_finalize(world: World, path: str) -> None:
    """Finalize names a line that got no result by its line index, reading no input: a batch whose input is gone
    ends (it re-raised NoSuchKey for good, `finalizing` for ever, the tenant's slot held)."""
    inp = world.make(path)
    batch_id = world.create(inp)
    task = BatchTaskInput(batch_id=batch_id)
    assert validate_batch(task, world.services).valid
    plan_batch(task, world.services)
    world.mutate(inp, "delete")
    world.services.batches.cancel("default", batch_id)
    assert finalize_batch(task, world.services).status == "cancelled"
    rec = world.batch(batch_id)
    _, failed = ended_once(world, rec, inp.ids)
    assert {x["error"]["code"] for x in failed.values()} == {"batch_cancelled"}


@pytest.mark.parametrize("mutation", ["same_size", "shrink", "delete"])
@pytest.mark.parametrize("path", ["object", "prefix"])
def test_a_versioned_bucket_keeps_the_batch_on_the_version_accepted(
        world: World, openai_client: OpenAI, path: str, mutation: str) -> None:
    """Where the bucket keeps versions, each object is read by its VersionId (the prefix's from Validate's first
    read): a change under the batch changes nothing of it, nor of the file's content."""
    world.s3.put_bucket_versioning(Bucket=world.user_bucket, VersioningConfiguration={"Status": "Enabled"})
    inp = world.make(path)
    batch_id = world.create(inp)
    accepted = b"".join(world.s3.get_object(Bucket=world.user_bucket, Key=o["Key"])["Body"].read()
                        for o in world.s3.list_objects_v2(Bucket=world.user_bucket, Prefix="in/")["Contents"])
    assert validate_batch(BatchTaskInput(batch_id=batch_id), world.services).valid
    world.mutate(inp, mutation)
    rec = world.run(batch_id)
    ok, failed = ended_once(world, rec, inp.ids)
    assert set(ok) == set(inp.ids) and not failed
    assert openai_client.files.content(rec.input_file_id).content == accepted


@pytest.mark.parametrize(("mutation", "code"), [("same_size", "input_changed"), ("delete", "input_changed"),
                                                ("denied", "input_unreadable")])
@pytest.mark.parametrize("path", PATHS)
def test_the_content_route_serves_the_version_accepted_or_says_why_not(
        world: World, openai_client: OpenAI, path: str, mutation: str, code: str) -> None:
    """After the batch ended: the accepted bytes, else an OpenAI-style 409 naming the object, asked before a byte
    is sent (it served the rewritten bytes as the batch's input, and a deleted object dropped the connection)."""
    inp = world.make(path)
    batch_id = world.create(inp)
    assert validate_batch(BatchTaskInput(batch_id=batch_id), world.services).valid
    rec = world.run(batch_id)
    accepted = openai_client.files.content(rec.input_file_id).content
    assert accepted.count(b"\n") == len(inp.ids)
    world.mutate(inp, mutation)
    with pytest.raises(openai.ConflictError) as e:
        openai_client.files.content(rec.input_file_id)
    assert e.value.code == code
    assert inp.key in e.value.message and rec.input_file_id in e.value.message


@pytest.mark.parametrize("path", PATHS)
def test_a_retry_reads_the_version_accepted_or_is_a_409(world: World, path: str) -> None:
    inp = world.make(path)
    batch_id = world.create(inp)
    assert validate_batch(BatchTaskInput(batch_id=batch_id), world.services).valid
    world.run(batch_id)
    again = retry_batch(world.services, "default", batch_id, RetryRequest(custom_ids=inp.ids[:2]))
    assert again.input_file_id != world.batch(batch_id).input_file_id
    world.mutate(inp, "same_size" if path != "prefix" else "delete")
    with pytest.raises(ConflictError) as e:
        retry_batch(world.services, "default", batch_id, RetryRequest(custom_ids=inp.changed_ids[:1]))
    assert e.value.code == "input_changed" and inp.key in e.value.message


def test_a_bom_at_the_start_of_each_object_of_a_prefix_is_dropped(world: World) -> None:
    """Each object of a prefix is a JSONL file of its own, read as a file is: a BOM at its start is dropped (it
    failed the batch, naming no object), and its end ends its last line even without a newline."""
    s3, bucket = world.s3, world.user_bucket
    s3.put_object(Bucket=bucket, Key="bom/a.jsonl", Body=BOM + doc(["a-0", "a-1"]))
    s3.put_object(Bucket=bucket, Key="bom/b.jsonl", Body=BOM + doc(["b-0", "b-1"]).rstrip(b"\n"))
    s3.put_object(Bucket=bucket, Key="bom/c.jsonl", Body=BOM + doc(["c-0"]))
    inp = Input({"nightbatch": {"input_uri": f"s3://{bucket}/bom/"}}, [], bucket, "", [], b"")
    batch_id = world.create(inp)
    assert validate_batch(BatchTaskInput(batch_id=batch_id), world.services).valid
    rec = world.run(batch_id)
    _, failed = ended_once(world, rec, ["a-0", "a-1", "b-0", "b-1", "c-0"])
    assert not failed
    # A retry reads the objects as Validate did.
    again = retry_batch(world.services, "default", batch_id, RetryRequest(custom_ids=["b-1", "c-0"]))
    assert world.lines(again.input_file_id) == [json.loads(line("b-1")), json.loads(line("c-0"))]


def test_an_error_in_an_object_of_a_prefix_names_the_object_and_its_line(world: World) -> None:
    s3, bucket = world.s3, world.user_bucket
    s3.put_object(Bucket=bucket, Key="bad/a.jsonl", Body=doc(["a-0", "a-1"]))
    s3.put_object(Bucket=bucket, Key="bad/b.jsonl", Body=doc(["b-0"]) + b"{not json\n")
    batch_id = world.create(Input({"nightbatch": {"input_uri": f"s3://{bucket}/bad/"}}, [], bucket, "", [], b""))
    assert not validate_batch(BatchTaskInput(batch_id=batch_id), world.services).valid
    [error] = (world.batch(batch_id).errors or {})["data"]
    assert error["line"] == 4 and error["code"] == "invalid_json_line"
    assert f"s3://{bucket}/bad/b.jsonl, its line 2" in error["message"]


def test_a_part_changed_before_composition_is_never_composed(world: World) -> None:
    """Composition reads the parts at the ETags the Upload's completion accepted: a changed part fails it, and
    the file keeps reading through its parts, where the change is seen."""
    inp = world.make("parts")
    batch_id = world.create(inp)
    assert validate_batch(BatchTaskInput(batch_id=batch_id), world.services).valid
    world.mutate(inp, "same_size")
    rec = world.services.files.item("default", world.batch(batch_id).input_file_id)
    with pytest.raises(Exception, match="PreconditionFailed"):
        world.services.assembly.compose(rec.pk, rec.upload_id or "")
    assert world.services.adapters.blobs.size(rec.s3_key) is None
    _, failed = ended_once(world, world.run(batch_id), inp.ids)
    assert set(inp.changed_ids) <= set(failed)


def test_a_composed_upload_records_its_etag_and_is_read_at_it(world: World) -> None:
    inp = world.make("parts")
    rec = world.services.files.item("default", inp.create["input_file_id"])
    world.services.assembly.compose(rec.pk, rec.upload_id or "")
    composed = world.services.files.item("default", rec.pk)
    assert not composed.parts and composed.etag == (world.services.adapters.blobs.head(rec.s3_key) or {})["ETag"]
    inp = Input(inp.create, inp.ids, inp.bucket, rec.s3_key, inp.ids, doc(inp.ids))
    batch_id = world.create(inp)
    world.mutate(inp, "same_size")
    assert not validate_batch(BatchTaskInput(batch_id=batch_id), world.services).valid
    assert (world.batch(batch_id).errors or {})["data"][0]["code"] == "input_changed"


def test_our_own_rewrite_of_an_input_is_no_change(world: World) -> None:
    """Validate writes an input again in place when the lifecycle would delete it before its batch ends (same
    bytes, possibly a new ETag: a multipart copy's). A reader pinned to the ETag it had reads on; any other
    change to it is one."""
    blobs = world.services.adapters.blobs
    data = doc(["k-0", "k-1"])
    etag = blobs.put_bytes("files/file-kept", data)
    source = InputSource(key="files/file-kept", bytes=len(data), etag=etag)
    # The same bytes as a multipart upload: another ETag, the one it had in its metadata (files/inputs.py: keep).
    s3 = blobs.client
    up = s3.create_multipart_upload(Bucket=blobs.bucket, Key="files/file-kept",
                                    Metadata={KEPT_ETAGS: etag.strip('"')})["UploadId"]
    part = s3.upload_part(Bucket=blobs.bucket, Key="files/file-kept", UploadId=up, PartNumber=1, Body=data)
    s3.complete_multipart_upload(Bucket=blobs.bucket, Key="files/file-kept", UploadId=up,
                                 MultipartUpload={"Parts": [{"ETag": part["ETag"], "PartNumber": 1}]})
    assert (blobs.head("files/file-kept") or {})["ETag"] != etag
    reader = InputReader(blobs, source)
    assert b"".join(reader.stream(0, len(data))) == data
    reader.check()
    blobs.put_bytes("files/file-kept", data.replace(b"k-1", b"k-2"))  # other bytes: no metadata names the pin
    with pytest.raises(ConflictError, match="changed after the batch accepted it"):
        b"".join(InputReader(blobs, source).stream(0, len(data)))


def test_an_in_place_batch_can_be_retried(world: World) -> None:
    """A retry of an `input_uri` batch inherited `input_uri` beside its new `input_file_id`: always a 400."""
    inp = world.make("object")
    batch_id = world.create(inp)
    assert validate_batch(BatchTaskInput(batch_id=batch_id), world.services).valid
    world.run(batch_id)
    again = retry_batch(world.services, "default", batch_id, RetryRequest(custom_ids=inp.ids[:3]))
    assert [x["custom_id"] for x in world.lines(again.input_file_id)] == inp.ids[:3]


def test_a_file_records_the_etag_it_was_written_with(world: World, make_jsonl: Callable[..., bytes]) -> None:
    f = world.services.files.create("default", filename="x.jsonl", purpose="batch",
                                    fileobj=io.BytesIO(make_jsonl(2)), size=len(make_jsonl(2)))
    rec = world.services.adapters.table.get_record(FileRecord, f.id)
    assert rec is not None and rec.etag == (world.services.adapters.blobs.head(rec.s3_key) or {})["ETag"]
