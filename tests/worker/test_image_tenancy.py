"""The worker resolves only what Validate's rules let a line name (gpu_worker/images.py through
nightbatch/validation/media.py), whatever the line it reads says: tenant B's image file named on tenant A's line
after Validate (a hand-written segment here; an input rewritten: tests/pipeline/test_image_tenancy.py) never
reaches the engine, as the file's object names its tenant; a URL off the allowed hosts, at any depth and on every
wire, never reaches the engine either; and an Anthropic image by reference inside a `tool_result` reaches it as
the image itself."""

from __future__ import annotations

import base64
from typing import Any

from nightbatch import layout
from nightbatch.aws import BlobStore
from nightbatch.aws.s3 import tagging
from nightbatch.layout import file_key
from nightbatch.tenancy.scope import tenant_tags
from tests.support.deterministic_engine import DeterministicEngine

from .conftest import CHAT_MODEL, ShardWorld
from .test_file_images import JPEG, PNG, file_line
from .test_runner import CHAT_SPEC, run

METADATA = "http://169.254.169.254/latest/meta-data/"
THEIRS = b"GIF89a team-b's private image" + bytes(50)


def put_tagged(blobs: BlobStore, key: str, data: bytes, tags: dict[str, str]) -> None:
    """An object of the deployment's bucket, stored with these tags (one PUT)."""
    blobs.client.put_object(Bucket=blobs.bucket, Key=key, Body=data, Tagging=tagging(tags))


def sent(engine: DeterministicEngine) -> str:
    """Everything the engine was given, as one text to search."""
    return repr([body for _, body in engine.received])


def test_another_tenants_file_named_after_validate_never_reaches_the_engine(world: ShardWorld) -> None:
    """The shard is tenant `default`'s. `file-theirs` is team-b's, validated for a batch of team-b's (so it carries
    the input tag the worker's role reads through, which every tenant's inputs carry alike); `file-legacy` has the
    input tag only. Neither is this shard's tenant's: each line is refused; the tenant's own image goes through."""
    blobs = world.adapters.blobs
    put_tagged(blobs, file_key("file-mine"), PNG, {**layout.INPUT_TAGS, **tenant_tags("default")})
    put_tagged(blobs, file_key("file-theirs"), THEIRS, {**layout.INPUT_TAGS, **tenant_tags("team-b")})
    put_tagged(blobs, file_key("file-legacy"), THEIRS, layout.INPUT_TAGS)
    world.seed([file_line("mine", "file-mine"), file_line("theirs", "file-theirs"),
                file_line("responses", "file-theirs", responses=True), file_line("legacy", "file-legacy")])
    engine = DeterministicEngine(CHAT_SPEC)
    run(world, engine)
    assert base64.b64encode(THEIRS).decode() not in sent(engine) and len(engine.received) == 1
    results, _ = world.results()
    assert results["mine"]["response"]["status_code"] == 200
    for custom_id, file_id, param in (("theirs", "file-theirs", "body.messages[0].content[1].image_url.url"),
                                      ("responses", "file-theirs", "body.input[0].content[1].file_id"),
                                      ("legacy", "file-legacy", "body.messages[0].content[1].image_url.url")):
        response = results[custom_id]["response"]
        assert response["status_code"] == 400
        assert response["body"]["error"] == {"message": f"No such File object: {file_id}",
                                             "type": "invalid_request_error", "param": param, "code": "invalid_image"}


def test_urls_validate_refuses_never_reach_the_engine_on_any_wire(world: ShardWorld) -> None:
    chat = {"custom_id": "chat", "body": {"model": CHAT_MODEL, "max_tokens": 8, "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": METADATA}}]}]}}
    video = {"custom_id": "video", "body": {"model": CHAT_MODEL, "max_tokens": 8, "messages": [
        {"role": "user", "content": [{"type": "video_url", "video_url": {"url": METADATA}}]}]}}
    world.seed([chat, video, {"custom_id": "plain", "body": {"model": CHAT_MODEL, "max_tokens": 8, "messages": [
        {"role": "user", "content": "hello"}]}}])
    engine = DeterministicEngine(CHAT_SPEC)
    run(world, engine)
    assert METADATA not in sent(engine) and len(engine.received) == 1
    results, _ = world.results()
    assert results["chat"]["response"]["body"]["error"] == {
        "message": "Invalid 'image_url.url': only data: URLs are accepted.", "type": "invalid_request_error",
        "param": "body.messages[0].content[0].image_url.url", "code": "invalid_value"}
    assert results["video"]["response"]["body"]["error"]["param"] == "body.messages[0].content[0].video_url.url"


def anthropic_request(custom_id: str, source: dict[str, Any]) -> dict[str, Any]:
    return {"custom_id": custom_id, "body": {"model": CHAT_MODEL, "max_tokens": 8, "messages": [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "look", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [
            {"type": "text", "text": "seen:"}, {"type": "image", "source": source}]}]}]}}


def test_anthropic_tool_result_images_are_resolved_and_checked(world: ShardWorld) -> None:
    s3 = world.adapters.client("s3")
    s3.create_bucket(Bucket="users-shots")
    s3.put_object(Bucket="users-shots", Key="screen.jpg", Body=JPEG)
    put_tagged(world.adapters.blobs, file_key("file-shot"), PNG, {**layout.INPUT_TAGS, **tenant_tags("default")})
    settings = world.settings.model_copy(deep=True)
    settings.files.user_input_buckets = "users-shots"
    world.seed([anthropic_request("s3", {"type": "url", "url": "s3://users-shots/screen.jpg"}),
                anthropic_request("file", {"type": "file", "file_id": "file-shot"}),
                anthropic_request("metadata", {"type": "url", "url": METADATA})], endpoint="/v1/messages")
    engine = DeterministicEngine(CHAT_SPEC)
    run(world, engine, settings=settings)
    sources = sorted((body["messages"][1]["content"][0]["content"][1]["source"] for _, body in engine.received),
                     key=str)
    assert sources == sorted([
        {"type": "url", "url": f"data:image/jpeg;base64,{base64.b64encode(JPEG).decode()}"},
        {"type": "url", "url": f"data:image/png;base64,{base64.b64encode(PNG).decode()}"}], key=str)
    results, _ = world.results()
    assert results["metadata"]["response"]["body"]["error"]["param"] == (
        "body.messages[1].content[0].content[1].source.url")
