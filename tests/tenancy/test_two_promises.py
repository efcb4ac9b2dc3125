"""The two promises, generated across input paths (docs/TENANCY.md, docs/ARCHITECTURE.md, decision 15): a tenant reaches
only its own files, batches and data on every path, and every accepted line ends exactly once, in the output or the
error file, whatever happens to its input after it was accepted.

Hypothesis picks how tenant A's batch gets its input (an uploaded file, an Upload read through its parts, an
in-place object, an in-place prefix, the Anthropic wire's inline requests, a retry of an ended batch), whether A
names tenant B's data at create (B's prefix as `input_uri`, B's file or B's `s3://` object as an image), and what
happens after create (nothing; A's input object overwritten at the same size with a custom_id repeated or with B's
file id in place of A's own image; shrunk; deleted; its GET denied by a bucket policy) — before Validate or after
it. Two more changes stand for a broken step upstream of the worker, to prove the downstream owner still holds: the
shard specs pointed at B's input (a broken Plan), and A's input rewritten to name B's image with the shard specs'
pins moved along (broken pinning). The real Validate, Plan, shard runner (the deterministic engine) and Finalize run
on moto's server; the content route is read over HTTP with A's key.

Each example checks: a refused create is a 400; every batch ends; when Validate accepted the input,
`request_counts.total` never changes and each accepted custom_id ends exactly once across the two files (and the
partial results already hold each once); and not a byte of B's input or image reaches A's output, error file,
errors, content route or engine requests.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
from dataclasses import dataclass, field
from typing import Any

import pytest
import requests
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpu_worker.runner import ShardJob, run_shard
from nightbatch import layout
from nightbatch.aws.records import BatchRecord
from nightbatch.aws.s3 import tagging
from nightbatch.batches.request import CreateBatchRequest
from nightbatch.errors import InvalidRequestError
from nightbatch.files.inputs import input_source
from nightbatch.files.uploads import CompleteUploadRequest, CreateUploadRequest
from nightbatch.messages import service as message_batches
from nightbatch.messages.objects import CreateMessageBatch
from nightbatch.pipeline import BatchTaskInput, finalize_batch, plan_batch, validate_batch
from nightbatch.results.partial import partial_results
from nightbatch.results.retry import RetryRequest, retry_batch
from nightbatch.shards.spec import read_manifest, read_shard, write_shard
from nightbatch.tenancy.keys import KeyStore
from nightbatch.wire import TERMINAL_STATUSES
from nightbatch.wiring import Services
from tests.conftest import ApiServer, unique_name
from tests.support.deterministic_engine import DeterministicEngine

MODEL = "SmolLM2-135M-Instruct"
URL = "/v1/chat/completions"
PATHS = ("upload", "parts", "object", "prefix", "anthropic", "retry")
ATTACKS = ("none", "their_prefix", "their_file_image", "their_s3_image")
CHANGES = ("none", "same_size", "their_file", "shrink", "delete", "denied", "their_spec", "their_pin")
UPSTREAM = ("their_spec", "their_pin")  # a broken step upstream of the worker: made after Plan
PNG = b"\x89PNG\r\n\x1a\n" + b"team-a's own picture" + bytes(40)
# A's prompt text: as long as B's secret marker, so that B's input (the same custom_ids: tenants pick theirs
# freely) lines up with A's line index byte for byte, and a broken reader would send B's lines as A's.
TEXT = "hello-there-abcdefgh"


@dataclass
class Tenant:
    name: str
    key: str
    secret: str = ""  # a marker in every byte of its data that must never reach another tenant
    image_id: str = ""  # a vision file of its own
    image: bytes = b""
    input_id: str = ""  # a batch input file of its own


@dataclass
class Example:
    path: str
    attack: str
    change: str
    before_validate: bool
    lines: int
    with_image: bool
    a: Tenant = field(init=False)
    b: Tenant = field(init=False)


@dataclass
class Target:
    """A's input object a change rewrites, and the custom_ids its lines hold (its last two of equal length)."""

    bucket: str
    key: str
    data: bytes
    in_place: bool


class World:
    def __init__(self, api: ApiServer, lake: str) -> None:
        self.api, self.lake = api, lake
        self.services: Services = api.services
        self.s3 = self.services.adapters.blobs.client
        self.bucket = self.services.settings.deployment.bucket
        self.engine = DeterministicEngine(self.services.settings.serving.model(MODEL))  # type: ignore[arg-type]

    def tenant(self, prefix: str) -> Tenant:
        name = unique_name(prefix)
        key, _ = KeyStore(self.services.adapters.table).create(name=unique_name("k"), tenant=name)
        return Tenant(name, key)

    def victim(self) -> Tenant:
        """Tenant B, with an input file, a vision file, an in-place input and an in-place image, each marked."""
        b = self.tenant("tb")
        b.secret = unique_name("SECRETB")[:len(TEXT)]
        assert len(b.secret) == len(TEXT)
        payload = b"".join(_chat(f"a{i:02d}", b.secret) + b"\n" for i in range(4))
        b.input_id = self.services.files.create(b.name, filename="b.jsonl", purpose="batch",
                                                fileobj=io.BytesIO(payload), size=len(payload)).id
        b.image = b"GIF89a " + b.secret.encode() + bytes(30)
        b.image_id = self.services.files.create(b.name, filename="b.gif", purpose="vision",
                                                fileobj=io.BytesIO(b.image), size=len(b.image)).id
        self.s3.put_object(Bucket=self.lake, Key=f"t/{b.name}/in.jsonl", Body=payload)
        self.s3.put_object(Bucket=self.lake, Key=f"t/{b.name}/img.gif", Body=b.image)
        return b

    def leaked(self, b: Tenant, data: bytes | str) -> bool:
        text = data if isinstance(data, str) else data.decode("utf-8", "replace")
        return b.secret in text or base64.b64encode(b.image).decode() in text

    # -- A's input ---------------------------------------------------------------------------------------

    def lines(self, ex: Example) -> list[bytes]:
        a, b = ex.a, ex.b
        out = []
        for i in range(ex.lines):
            image = None
            if i == 0 and ex.with_image:
                image = a.image_id
            if i == 0 and ex.attack == "their_file_image":
                image = b.image_id
            if i == 0 and ex.attack == "their_s3_image":
                image = f"s3://{self.lake}/t/{b.name}/img.gif"
            if ex.path == "anthropic":
                out.append(_message(f"a{i:02d}", image))
            else:
                out.append(_chat(f"a{i:02d}", TEXT, image))
        return out

    def create(self, ex: Example) -> tuple[str, Target]:
        """A's batch over its input made the example's way; InvalidRequestError where the create refuses it."""
        a, services = ex.a, self.services
        lines = self.lines(ex)
        payload = b"".join(x + b"\n" for x in lines)
        if ex.path in ("object", "prefix"):
            owner = ex.b.name if ex.attack == "their_prefix" else a.name
            if ex.path == "object":
                key = f"t/{a.name}/in.jsonl"
                self.s3.put_object(Bucket=self.lake, Key=key, Body=payload)
                uri = f"s3://{self.lake}/t/{owner}/in.jsonl"
                target = Target(self.lake, key, payload, True)
            else:
                keys = [f"t/{a.name}/p/{n}.jsonl" for n in range(2)]
                halves = [lines[:1], lines[1:]]
                for key, half in zip(keys, halves, strict=True):
                    self.s3.put_object(Bucket=self.lake, Key=key, Body=b"".join(x + b"\n" for x in half))
                uri = f"s3://{self.lake}/t/{owner}/" + ("p/" if owner == a.name else "")
                target = Target(self.lake, keys[0], lines[0] + b"\n", True)
            batch = services.batches.create(a.name, CreateBatchRequest(
                endpoint=URL, completion_window="24h", nightbatch={"input_uri": uri}))
            return batch.id, target
        if ex.path == "anthropic":
            body = CreateMessageBatch.model_validate({"requests": [json.loads(x) for x in lines]})
            made = message_batches.create(services, a.name, body)
            batch_id = message_batches.batch_id_of(made.id)
            assert batch_id is not None
            rec = services.batches.item(a.name, batch_id)
            return batch_id, Target(self.bucket, layout.file_key(rec.input_file_id), payload, False)
        if ex.path == "parts":
            services.uploads.jobs.compose = lambda *a_, **k: None  # read through its parts: composition never runs
            pieces = [lines[0] + b"\n", b"".join(x + b"\n" for x in lines[1:])]
            up = services.uploads.create(a.name, CreateUploadRequest(
                bytes=len(payload), filename="a.jsonl", mime_type="text/jsonl", purpose="batch"))
            ids = [services.uploads.add_part(a.name, up.id, io.BytesIO(p), len(p)).id for p in pieces]
            done = services.uploads.complete(a.name, up.id, CompleteUploadRequest(part_ids=ids))
            assert done.file is not None
            parts = services.files.item(a.name, done.file.id).parts
            assert parts
            batch = services.batches.create(a.name, CreateBatchRequest(
                input_file_id=done.file.id, endpoint=URL, completion_window="24h"))
            return batch.id, Target(self.bucket, parts[0], pieces[0], False)
        f = services.files.create(a.name, filename="a.jsonl", purpose="batch", fileobj=io.BytesIO(payload),
                                  size=len(payload))
        batch = services.batches.create(a.name, CreateBatchRequest(input_file_id=f.id, endpoint=URL,
                                                                   completion_window="24h"))
        if ex.path == "upload":
            return batch.id, Target(self.bucket, layout.file_key(f.id), payload, False)
        # A retry: the first batch runs to its end, then every line is retried through a new input file. (A
        # first batch refused at Validate, naming B's image, is the example's batch: a re-run of Validate answers
        # as the first did.)
        if not validate_batch(BatchTaskInput(batch_id=batch.id), services).valid:
            return batch.id, Target(self.bucket, layout.file_key(f.id), payload, False)
        self.run(ex, batch.id)
        retried = retry_batch(services, a.name, batch.id, RetryRequest(
            custom_ids=[json.loads(x)["custom_id"] for x in lines]))
        new_input = services.batches.item(a.name, retried.id).input_file_id
        return retried.id, Target(self.bucket, layout.file_key(new_input), payload, False)

    # -- changes -----------------------------------------------------------------------------------------

    def change(self, ex: Example, target: Target) -> bytes | None:
        """Rewrites, shrinks, deletes or denies A's input object; returns the bytes it now holds, if any."""
        data, kind = target.data, ex.change
        if kind in ("same_size", "their_file", "their_pin"):
            if kind != "same_size" and ex.with_image and ex.a.image_id.encode() in data:
                new = data.replace(ex.a.image_id.encode(), ex.b.image_id.encode())
            else:  # a custom_id repeated, at the same size
                ids = [json.loads(x)["custom_id"] for x in data.splitlines()]
                new = data.replace(ids[-1].encode(), ids[0].encode())
            self._put(target, new)
            return new
        if kind == "shrink":
            self._put(target, data[:len(data) // 2])
        elif kind == "delete":
            self.s3.delete_object(Bucket=target.bucket, Key=target.key)
        elif kind == "denied":
            self.s3.put_bucket_policy(Bucket=target.bucket, Policy=json.dumps({"Version": "2012-10-17", "Statement": [
                {"Effect": "Deny", "Principal": "*", "Action": "s3:GetObject",
                 "Resource": f"arn:aws:s3:::{target.bucket}/{target.key}"}]}))
        return None

    def _put(self, target: Target, data: bytes) -> None:
        """An overwrite; an object of ours keeps its tags (the tenant's and the input's), as a broken step of ours
        that rewrote it would."""
        extra: dict[str, Any] = {}
        if not target.in_place:
            tags = self.services.adapters.blobs.tags(target.key)
            extra["Tagging"] = tagging(tags)
        self.s3.put_object(Bucket=target.bucket, Key=target.key, Body=data, **extra)

    def upstream(self, ex: Example, batch_id: str, target: Target) -> None:
        """After Plan: the shard specs pointed at B's input (`their_spec`), or A's input rewritten to name B's image
        with the specs' pins moved to the new object (`their_pin`)."""
        blobs = self.services.adapters.blobs
        if ex.change == "their_pin":
            if self.change(ex, target) is None:
                return
            etag = str(self.s3.head_object(Bucket=target.bucket, Key=target.key)["ETag"])
        for item in read_manifest(blobs, batch_id):
            spec = read_shard(blobs, batch_id, item.shard_id)
            assert spec is not None and spec.input is not None
            if ex.change == "their_spec":
                spec.input = input_source(blobs, self.services.files.item(ex.b.name, ex.b.input_id))
            else:
                spec.input.parts = [p.model_copy(update={"etag": etag, "version_id": ""}) if p.key == target.key
                                    else p for p in spec.input.parts]
                if spec.input.key == target.key:
                    spec.input.etag = etag
            write_shard(blobs, spec)

    # -- the chain ---------------------------------------------------------------------------------------

    def run(self, ex: Example, batch_id: str, target: Target | None = None) -> None:
        """Plan, the upstream breakage if any, every shard on the engine, the partial results, Finalize."""
        services = self.services
        plan_batch(BatchTaskInput(batch_id=batch_id), services)
        if target is not None and ex.change in UPSTREAM:
            self.upstream(ex, batch_id, target)
        blobs = services.adapters.blobs
        for item in read_manifest(blobs, batch_id):
            report = asyncio.run(run_shard(ShardJob(batch_id=batch_id, shard_id=item.shard_id), engine=self.engine,
                                           blobs=blobs, table=services.adapters.table, settings=services.settings))
            assert report.finished
        streamed = [json.loads(x)["custom_id"] for kind in ("output", "error")
                    for x in partial_results(services, ex.a.name, batch_id, kind).lines]
        assert len(streamed) == len(set(streamed)) == self.batch(batch_id).request_counts["total"]
        finalize_batch(BatchTaskInput(batch_id=batch_id), services)

    def batch(self, batch_id: str) -> BatchRecord:
        rec = self.services.adapters.table.get_record(BatchRecord, batch_id)
        assert rec is not None
        return rec

    def file_bytes(self, a: Tenant, file_id: str | None) -> bytes:
        if not file_id:
            return b""
        return b"".join(self.services.files.chunks(self.services.files.item(a.name, file_id)))

    def content(self, a: Tenant, file_id: str) -> requests.Response:
        return requests.get(f"{self.api.v1}/files/{file_id}/content", timeout=60,
                            headers={"Authorization": f"Bearer {a.key}"})


def _chat(custom_id: str, text: str, image: str | None = None) -> bytes:
    content: Any = text
    if image is not None:
        content = [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": image}}]
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": URL, "body": {
        "model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 4}}).encode()


def _message(custom_id: str, image: str | None = None) -> bytes:
    content: Any = "hello"
    if image is not None:
        source = ({"type": "url", "url": image} if image.startswith("s3://") else {"type": "file", "file_id": image})
        content = [{"type": "text", "text": "hello"}, {"type": "image", "source": source}]
    return json.dumps({"custom_id": custom_id, "params": {
        "model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": content}]}}).encode()


@pytest.fixture
def world(serve_api: Any) -> World:
    lake = unique_name("users-lake")
    api = serve_api(user_input_buckets=f"s3://{lake}/t/{{tenant}}/")
    api.services.adapters.blobs.client.create_bucket(Bucket=lake)
    return World(api, lake)


examples = st.builds(
    Example, path=st.sampled_from(PATHS), attack=st.sampled_from(ATTACKS), change=st.sampled_from(CHANGES),
    before_validate=st.booleans(), lines=st.integers(2, 4), with_image=st.booleans())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ex=examples)
# Always, whatever hypothesis draws: the broken-upstream cases, where only the worker's own checks stand.
@example(ex=Example("upload", "none", "their_spec", False, 3, False))
@example(ex=Example("prefix", "none", "their_spec", False, 3, False))
@example(ex=Example("upload", "none", "their_pin", False, 2, True))
@example(ex=Example("object", "none", "their_pin", False, 3, True))
@example(ex=Example("anthropic", "none", "their_pin", False, 2, True))  # a line left without its `body`
def test_each_tenant_reaches_only_its_own_data_and_every_accepted_line_ends_once(world: World, ex: Example) -> None:
    ex.b = world.victim()
    ex.a = world.tenant("ta")
    ex.a.image_id = world.services.files.create(ex.a.name, filename="a.png", purpose="vision",
                                                fileobj=io.BytesIO(PNG), size=len(PNG)).id
    world.engine.received.clear()
    try:
        batch_id, target = world.create(ex)
    except InvalidRequestError as e:
        # Refused at create: only an attack on B's data (or an image on the Anthropic wire, checked there) is.
        assert ex.attack != "none", e.message
        assert e.status == 400 and not world.leaked(ex.b, e.message)
        return
    assert ex.attack in ("none", "their_file_image", "their_s3_image") or ex.path not in ("object", "prefix")
    if ex.before_validate and ex.change not in UPSTREAM:
        world.change(ex, target)
    valid = validate_batch(BatchTaskInput(batch_id=batch_id), world.services).valid
    rec = world.batch(batch_id)
    assert valid == (rec.status != "failed")
    if ex.attack in ("their_file_image", "their_s3_image"):
        assert not valid  # a line naming B's image is refused with its line number
    accepted = [json.loads(x)["custom_id"] for x in world.lines(ex)] if valid else []
    if valid:
        assert rec.request_counts["total"] == len(accepted)
        if not ex.before_validate and ex.change not in UPSTREAM:
            world.change(ex, target)
        world.run(ex, batch_id, target)
        rec = world.batch(batch_id)
    assert rec.status in TERMINAL_STATUSES
    out, err = world.file_bytes(ex.a, rec.output_file_id), world.file_bytes(ex.a, rec.error_file_id)
    if valid:
        ended = [json.loads(x)["custom_id"] for x in (out + err).splitlines()]
        assert sorted(ended) == sorted(accepted)  # each accepted line once, none more
        assert rec.request_counts["total"] == len(accepted)
        assert rec.request_counts["completed"] + rec.request_counts["failed"] == len(accepted)
    sent = json.dumps([body for _, body in world.engine.received])
    for where, data in (("engine", sent), ("output", out), ("errors file", err),
                        ("batch errors", json.dumps(rec.errors or {}))):
        assert not world.leaked(ex.b, data), where
    for file_id in (rec.input_file_id, rec.output_file_id, rec.error_file_id):
        if file_id:
            got = world.content(ex.a, file_id)
            assert got.status_code in (200, 409), got.text
            assert not world.leaked(ex.b, got.content), file_id
    if ex.path not in ("anthropic",) and ex.attack == "none":  # the input as accepted, or a 409 saying it is gone
        got = world.content(ex.a, rec.input_file_id)
        assert got.status_code == 409 or got.content == b"".join(x + b"\n" for x in world.lines(ex))
    world.s3.delete_bucket_policy(Bucket=target.bucket)
