"""Images by reference (gpu_worker/images.py): an `s3://` image of an allow-listed bucket reaches the engine as
the image itself (a data: URL of the object's bytes); an over-size or missing one is that line's clear 400, and
the other lines run. Validate accepts `s3://` images of the allow-listed buckets only."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from gpu_worker.images import ImageError
from nightbatch.settings import Settings
from nightbatch.tenancy.scope import Scope
from nightbatch.validation.file_images import FileImages
from nightbatch.validation.invalid import LineInvalid
from nightbatch.validation.media import check_references
from tests.support.deterministic_engine import DeterministicEngine

from .conftest import CHAT_MODEL, ShardWorld, resolve_images
from .test_runner import CHAT_SPEC, run

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(200))
CHAT = "/v1/chat/completions"


def line(custom_id: str, url: str, *, responses: bool = False) -> dict[str, Any]:
    if responses:
        part: dict[str, Any] = {"type": "input_image", "image_url": url}
        return {"custom_id": custom_id, "body": {"model": CHAT_MODEL, "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "what is it?"}, part]}]}}
    return {"custom_id": custom_id, "body": {"model": CHAT_MODEL, "max_tokens": 8, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "what is it?"},
                                     {"type": "image_url", "image_url": {"url": url}}]}]}}


def test_s3_images_reach_the_engine_as_images(world: ShardWorld) -> None:
    s3 = world.adapters.client("s3")
    s3.create_bucket(Bucket="users-images")
    s3.put_object(Bucket="users-images", Key="cat.png", Body=PNG, ContentType="image/png")
    s3.put_object(Bucket="users-images", Key="big.jpg", Body=b"\xff" * 5000)
    world.seed([line("ok", "s3://users-images/cat.png"), line("big", "s3://users-images/big.jpg"),
                line("gone", "s3://users-images/missing.png"), line("plain", "data:image/png;base64,AAAA")])
    settings = world.settings.model_copy(deep=True)
    settings.validation.max_image_bytes = 1000
    settings.files.user_input_buckets = "users-images"
    engine = DeterministicEngine(CHAT_SPEC)
    run(world, engine, settings=settings)
    urls = [body["messages"][0]["content"][1]["image_url"]["url"] for _, body in engine.received]
    assert sorted(urls) == sorted([f"data:image/png;base64,{base64.b64encode(PNG).decode()}",
                                   "data:image/png;base64,AAAA"])  # the failing lines never reached it
    results, _ = world.results()
    assert results["ok"]["response"]["status_code"] == 200
    big = results["big"]["response"]
    assert big["status_code"] == 400
    assert big["body"]["error"]["message"] == ("The image s3://users-images/big.jpg is 5000 bytes, over the "
                                               "limit of 1000 bytes per image.")
    assert big["body"]["error"]["param"] == "body.messages[0].content[1].image_url.url"
    assert results["gone"]["response"]["status_code"] == 400
    assert "could not be read (NoSuchKey)" in results["gone"]["response"]["body"]["error"]["message"]


def test_responses_input_images_are_resolved_too(world: ShardWorld) -> None:
    s3 = world.adapters.client("s3")
    s3.create_bucket(Bucket="users-images")
    s3.put_object(Bucket="users-images", Key="a/cat.jpg", Body=PNG)
    body = line("r", "s3://users-images/a/cat.jpg", responses=True)["body"]
    settings = world.settings.model_copy(deep=True)
    settings.files.user_input_buckets = "users-images"
    out = resolve_images(world, body, endpoint="/v1/responses", settings=settings)
    assert out["input"][0]["content"][1]["image_url"] == f"data:image/jpeg;base64,{base64.b64encode(PNG).decode()}"
    assert body["input"][0]["content"][1]["image_url"].startswith("s3://")  # the line itself is left as it was
    # The worker's own bucket (or any other) is never fetched, even for a line Validate did not see.
    own = line("o", f"s3://{world.settings.deployment.bucket}/batches/x.png", responses=True)["body"]
    with pytest.raises(ImageError, match="names the deployment's own bucket"):
        resolve_images(world, own, endpoint="/v1/responses", settings=settings)


def test_validate_takes_s3_images_of_the_allow_listed_buckets_only() -> None:
    settings = Settings(files={"user_input_buckets": "users-images"})
    refs = FileImages(lambda _: None, max_bytes=1000, scope=Scope.of(settings, "default"))
    check_references(settings, CHAT, line("a", "s3://users-images/cat.png")["body"], refs)
    with pytest.raises(LineInvalid) as e:
        check_references(settings, CHAT, line("b", "s3://someone-else/cat.png")["body"], refs)
    assert e.value.error[0] == "bucket_not_allowed"
    assert e.value.error[2] == "body.messages[0].content[1].image_url.url"

