"""Every media reference of a line is checked where the line is validated, on every wire and at any depth
(nightbatch/validation/media.py): an Anthropic image inside a `tool_result` is checked (URL, size) and counted like
a top-level one, a Responses `function_call_output` image like an input one; `s3://` images that are not plain S3
names are line-numbered errors; the images a line names by file id are bounded in total, each distinct file counted
once; and Validate gives an accepted file (or input) its tenant's tag when it was stored without one."""

from __future__ import annotations

import base64
import io
from typing import Any

from nightbatch import layout
from nightbatch.aws.records import FileRecord
from nightbatch.pipeline import BatchTaskInput, validate_batch
from nightbatch.tenancy.scope import tenant_tags
from nightbatch.validation.invalid import LineInvalid
from nightbatch.validation.lines import Validator, line_error
from nightbatch.wire import BatchError
from nightbatch.wiring import Services
from tests.support.pipeline_world import jsonl, make_batch
from tests.worker.test_file_images import PNG, file_line
from tests.worker.test_s3_images import line

MODEL = "SmolLM2-135M-Instruct"
METADATA = "http://169.254.169.254/latest/meta-data/"
SMALL = base64.b64encode(PNG).decode()


def image(source: dict[str, Any]) -> dict[str, Any]:
    return {"type": "image", "source": source}


def tool_result(*content: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": "toolu_1", "content": list(content)}


def anthropic_line(custom_id: str, *blocks: dict[str, Any]) -> dict[str, Any]:
    """A Message Batch request as its line: an assistant's tool call, then the user's turn holding `blocks`."""
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/messages", "body": {
        "model": MODEL, "max_tokens": 8, "messages": [
            {"role": "user", "content": "look it up"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "fetch", "input": {
                "image_url": METADATA}}]},  # a tool's arguments are not media: never read as a reference
            {"role": "user", "content": list(blocks)}]}}


def errors_of(services: Services, payload: bytes, endpoint: str) -> list[BatchError]:
    batch_id = make_batch(services, payload, endpoint=endpoint)
    validate_batch(BatchTaskInput(batch_id=batch_id), services)
    batch = services.batches.get("default", batch_id)
    return batch.errors.data if batch.errors is not None and batch.errors.data is not None else []


def checked(services: Services, lines: list[dict[str, Any]], endpoint: str) -> list[BatchError]:
    """The lines through Validate's line checks (a Message Batch's requests are checked so at create, and again
    by Validate), as the errors Validate would record."""
    validator = Validator(settings=services.settings, endpoint=endpoint, file_images=services.files.images("default"))
    errors = []
    for n, data in enumerate(jsonl(lines).splitlines(), start=1):
        try:
            validator.check(n, data, len(data))
        except LineInvalid as e:
            errors.append(line_error(n, e))
    return errors


def test_an_anthropic_tool_result_image_is_checked_and_counted_like_a_top_level_one(services: Services) -> None:
    services.settings.validation.max_image_bytes = 300
    services.settings.validation.max_images_per_request = 3
    services.settings.validation.media_allowed_domains = "images.example.com"
    base64_image = {"type": "base64", "media_type": "image/png", "data": SMALL}
    lines = [
        anthropic_line("top", image({"type": "url", "url": METADATA})),
        anthropic_line("nested", tool_result({"type": "text", "text": "here"},
                                             image({"type": "url", "url": METADATA}))),
        anthropic_line("deeper", tool_result({"type": "text", "text": "x", "content": [
            image({"type": "url", "url": METADATA})]})),
        anthropic_line("count", image(base64_image), tool_result(image(base64_image), image(base64_image)),
                       tool_result(image(base64_image))),
        anthropic_line("big", tool_result(image({"type": "base64", "media_type": "image/png", "data": "A" * 800}))),
        anthropic_line("ok", image(base64_image), tool_result(image({"type": "url",
                                                                    "url": "https://images.example.com/a.png"}))),
    ]
    errors = checked(services, lines, "/v1/messages")
    turn = "body.messages[2].content"
    assert [(e.line, e.code, e.param) for e in errors] == [
        (1, "invalid_value", f"{turn}[0].source.url"),
        (2, "invalid_value", f"{turn}[0].content[1].source.url"),
        (3, "invalid_value", f"{turn}[0].content[0].content[0].source.url"),
        (4, "too_many_images", f"{turn}[2].content[0].source.data"),
        (5, "image_too_large", f"{turn}[0].content[0].source.data")]
    assert errors[1].message == ("Invalid 'source.url': only data: URLs are accepted, or https URLs on "
                                 "images.example.com.")
    assert "at most 3 are allowed per request" in errors[3].message


def test_a_responses_tool_output_image_is_checked_like_an_input_one(services: Services) -> None:
    body = {"model": MODEL, "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "what did the tool see?"}]},
        {"type": "function_call_output", "call_id": "call_1", "output": [
            {"type": "input_image", "image_url": METADATA}]}]}
    errors = errors_of(services, jsonl([{"custom_id": "r", "method": "POST", "url": "/v1/responses",
                                         "body": body}]), "/v1/responses")
    assert [(e.line, e.code, e.param) for e in errors] == [(1, "invalid_value", "body.input[1].output[0].image_url")]


def test_an_s3_image_that_is_not_a_plain_s3_name_is_a_line_error(services: Services) -> None:
    """`*` and keys over S3's 1,024 bytes are refused by the one URI parser (tenancy/scope.py), with the line."""
    services.settings.files.user_input_buckets = "users-images"
    lines = [dict(line(c, u), method="POST", url="/v1/chat/completions") for c, u in (
        ("ok", "s3://users-images/a.png"), ("star", "s3://users-images/*.png"),
        ("long", "s3://users-images/" + "k" * 1100), ("dots", "s3://users-images/a/%2e%2e/b.png"))]
    errors = errors_of(services, jsonl(lines), "/v1/chat/completions")
    param = "body.messages[0].content[1].image_url.url"
    assert [(e.line, e.code, e.param) for e in errors] == [(2, "invalid_value", param), (3, "invalid_value", param),
                                                           (4, "invalid_value", param)]
    assert "'*' is not allowed" in errors[0].message and "at most 1024 bytes" in errors[1].message


def upload(services: Services, data: bytes = PNG) -> str:
    return services.files.create("default", filename="cat.png", purpose="vision", fileobj=io.BytesIO(data),
                                 size=len(data)).id


def test_the_images_a_line_names_by_file_id_are_bounded_in_total_each_counted_once(services: Services) -> None:
    services.settings.validation.max_image_bytes_per_request = 1000
    a, b, c = (upload(services, PNG + bytes(200)) for _ in range(3))  # 408 bytes each
    twice = file_line("twice", a)
    twice["body"]["messages"][0]["content"] += [{"type": "image_url", "image_url": {"url": a}},
                                                {"type": "image_url", "image_url": {"url": b}}]
    three = file_line("three", a)
    three["body"]["messages"][0]["content"] += [{"type": "image_url", "image_url": {"url": b}},
                                                {"type": "image_url", "image_url": {"url": c}}]
    errors = errors_of(services, jsonl([dict(x, method="POST", url="/v1/chat/completions") for x in (twice, three)]),
                       "/v1/chat/completions")
    assert [(e.line, e.code, e.param) for e in errors] == [
        (2, "image_too_large", "body.messages[0].content[3].image_url.url")]
    assert "total about 1224 bytes, over the limit of 1000 bytes per request" in errors[0].message


def test_validate_gives_a_file_stored_without_its_tenant_its_tag(services: Services) -> None:
    """Objects stored before files carried their tenant from the start: Validate, which looked the file up as the
    batch tenant's, tags it so (with the input tag), for the worker's check."""
    blobs = services.adapters.blobs
    file_id = upload(services)
    image_key = layout.file_key(file_id)
    blobs.client.delete_object_tagging(Bucket=blobs.bucket, Key=image_key)
    batch_id = make_batch(services, jsonl([dict(file_line("a", file_id), method="POST", url="/v1/chat/completions")]))
    input_key = layout.file_key(services.batches.get("default", batch_id).input_file_id)
    blobs.client.delete_object_tagging(Bucket=blobs.bucket, Key=input_key)
    assert validate_batch(BatchTaskInput(batch_id=batch_id), services).valid
    for key in (image_key, input_key):
        assert blobs.tags(key) == {**layout.INPUT_TAGS, **tenant_tags("default")}
    assert services.adapters.table.get_record(FileRecord, file_id) is not None
