"""The image guards Validate applies where it knows enough (nightbatch/validation/requests.py): images per line,
the size of inline ones, and `s3://` images of the allow-listed buckets only, on chat and responses lines alike;
each a line-numbered error. (An `s3://` image's size is the worker's to check: tests/worker/test_s3_images.py.)"""

from __future__ import annotations

from nightbatch.pipeline import BatchTaskInput, validate_batch
from nightbatch.wiring import Services
from tests.support.pipeline_world import jsonl, make_batch
from tests.worker.test_s3_images import line


def test_validate_counts_images_and_sizes_inline_ones_by_line(services: Services) -> None:
    services.settings.files.user_input_buckets = "users-images"
    services.settings.validation.max_image_bytes = 300
    services.settings.validation.max_images_per_request = 2
    many = line("many", "s3://users-images/a.png")
    many["body"]["messages"][0]["content"] += [{"type": "image_url", "image_url": {"url": "s3://users-images/b"}}] * 2
    lines = [dict(line("ok", "s3://users-images/a.png"), method="POST", url="/v1/chat/completions"),
             dict(line("big", "data:image/png;base64," + "A" * 800), method="POST", url="/v1/chat/completions"),
             dict(many, method="POST", url="/v1/chat/completions")]
    batch_id = make_batch(services, jsonl(lines))
    assert validate_batch(BatchTaskInput(batch_id=batch_id), services).valid is False
    batch = services.batches.get("default", batch_id)
    assert batch.errors is not None
    errors = batch.errors.data
    assert [(e.line, e.code, e.param) for e in errors] == [
        (2, "image_too_large", "body.messages[0].content[1].image_url.url"),
        (3, "too_many_images", "body.messages[0].content[3].image_url.url")]
    assert "about 600 bytes, over the limit of 300 bytes per image" in errors[0].message


def test_validate_refuses_responses_images_off_the_allow_list(services: Services) -> None:
    services.settings.files.user_input_buckets = "users-images"
    lines = [dict(line(c, u, responses=True), method="POST", url="/v1/responses")
             for c, u in (("ok", "s3://users-images/a.png"), ("no", "s3://nightbatch-data/batches/x.png"))]
    batch_id = make_batch(services, jsonl(lines), endpoint="/v1/responses")
    assert validate_batch(BatchTaskInput(batch_id=batch_id), services).valid is False
    batch = services.batches.get("default", batch_id)
    assert batch.errors is not None
    errors = batch.errors.data
    assert [(e.line, e.code, e.param) for e in errors] == [
        (2, "bucket_not_allowed", "body.input[0].content[1].image_url")]
