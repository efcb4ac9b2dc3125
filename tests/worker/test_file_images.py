"""Images by file id (gpu_worker/images.py): a line naming a file of the Files API reaches the engine with the
file's bytes as a data: URL, on chat (`image_url.url`, nightbatch's extension) and responses (`file_id`, OpenAI's
shape) alike; a file deleted after Validate is that line's clear 400, and the other lines run."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from gpu_worker.images import ImageError
from nightbatch.layout import file_key
from nightbatch.tenancy.scope import tenant_tags
from nightbatch.validation.media import references
from tests.support.deterministic_engine import DeterministicEngine

from .conftest import CHAT_MODEL, ShardWorld, resolve_images
from .test_runner import CHAT_SPEC, run

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(200))
JPEG = b"\xff\xd8\xff\xe0" + bytes(100)


def file_line(custom_id: str, file_id: str, *, responses: bool = False) -> dict[str, Any]:
    """A line naming `file_id` as its image: the chat extension's `image_url.url`, or responses' `file_id`."""
    if responses:
        return {"custom_id": custom_id, "body": {"model": CHAT_MODEL, "input": [{"role": "user", "content": [
            {"type": "input_text", "text": "what is it?"}, {"type": "input_image", "file_id": file_id}]}]}}
    return {"custom_id": custom_id, "body": {"model": CHAT_MODEL, "max_tokens": 8, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "what is it?"},
                                     {"type": "image_url", "image_url": {"url": file_id}}]}]}}


def test_file_images_reach_the_engine_as_images(world: ShardWorld) -> None:
    blobs = world.adapters.blobs
    # As the Files API stores an upload: no image content type, the tenant's tag.
    blobs.put_bytes(file_key("file-cat"), PNG, tags=tenant_tags("default"))
    blobs.put_bytes(file_key("file-big"), b"\xff" * 5000, tags=tenant_tags("default"))
    world.seed([file_line("ok", "file-cat"), file_line("again", "file-cat"), file_line("big", "file-big"),
                file_line("gone", "file-deletedaftervalidate")])
    settings = world.settings.model_copy(deep=True)
    settings.validation.max_image_bytes = 1000
    engine = DeterministicEngine(CHAT_SPEC)
    run(world, engine, settings=settings)
    png = f"data:image/png;base64,{base64.b64encode(PNG).decode()}"
    assert [body["messages"][0]["content"][1]["image_url"]["url"] for _, body in engine.received] == [png, png]
    results, _ = world.results()
    assert results["ok"]["response"]["status_code"] == results["again"]["response"]["status_code"] == 200
    big = results["big"]["response"]
    assert (big["status_code"], big["body"]["error"]["param"]) == (400, "body.messages[0].content[1].image_url.url")
    assert big["body"]["error"]["message"] == ("The image file file-big is 5000 bytes, over the limit of 1000 "
                                               "bytes per image.")
    gone = results["gone"]["response"]
    assert gone["status_code"] == 400
    assert gone["body"]["error"] == {
        "message": "The image file file-deletedaftervalidate could not be read (NoSuchKey): it was deleted, or "
                   "expired, after the batch was validated.",
        "type": "invalid_request_error", "param": "body.messages[0].content[1].image_url.url",
        "code": "invalid_image"}


def test_a_responses_file_id_becomes_the_input_images_url(world: ShardWorld) -> None:
    world.adapters.blobs.put_bytes(file_key("file-photo"), JPEG, tags=tenant_tags("default"))
    body = file_line("r", "file-photo", responses=True)["body"]
    out = resolve_images(world, body, endpoint="/v1/responses")
    assert out["input"][0]["content"][1] == {
        "type": "input_image", "image_url": f"data:image/jpeg;base64,{base64.b64encode(JPEG).decode()}"}
    assert body["input"][0]["content"][1]["file_id"] == "file-photo"  # the line itself is left as it was


def test_only_strings_of_a_file_ids_shape_are_read_as_files(world: ShardWorld) -> None:
    """A key is built from a line's string only when it has the shape of our ids: a line Validate did not see
    (a bug, a hand-written segment) cannot make the worker read another key of its bucket."""
    for ref in ("file-../batches/x", "file-", "files/file-cat"):
        body = file_line("x", ref)["body"]
        assert not any(r.by_reference for r in references("/v1/chat/completions", body))
        with pytest.raises(ImageError) as e:  # and the worker refuses the line, as Validate would
            resolve_images(world, body)
        assert e.value.param == "body.messages[0].content[1].image_url.url"
