"""L2: hostile input lines end as clear per-line errors, echo little, and cannot bloat a batch's error list."""

from __future__ import annotations

from nightbatch.pipeline import BatchTaskInput, validate_batch
from nightbatch.validation.lines import MAX_ERRORS_BYTES
from nightbatch.wiring import Services
from tests.support.pipeline_world import chat_line, jsonl, make_batch


def _errors(services: Services, payload: bytes) -> list:
    batch_id = make_batch(services, payload)
    assert validate_batch(BatchTaskInput(batch_id=batch_id), services).valid is False
    batch = services.batches.get("default", batch_id)
    assert batch.status == "failed" and batch.errors is not None
    return batch.errors.data


def test_a_deeply_nested_line_is_a_per_line_error(services: Services) -> None:
    deep = b'{"custom_id": "x", "body": ' + b"[" * 200_000 + b"]" * 200_000 + b"}\n"
    [err] = _errors(services, jsonl([chat_line(1)]) + deep)
    assert (err.code, err.line) == ("invalid_json_line", 2)
    assert "too deeply" in err.message


def test_echoed_model_and_method_are_truncated(services: Services) -> None:
    long = "m" * 100_000
    errs = _errors(services, jsonl([{**chat_line(1), "method": long},
                                    {**chat_line(2), "body": {"model": long, "messages": [{"role": "user"}]}}]))
    assert [e.code for e in errs] == ["invalid_method", "model_not_found"]
    for e in errs:
        assert len(e.message) < 400 and "m" * 64 + "…" in e.message
    [nested] = _errors(services, jsonl([{**chat_line(1), "method": [[["GET"]]]}]))
    assert "an array" in nested.message


def test_the_error_list_of_a_batch_is_capped_in_bytes(services: Services) -> None:
    long = "m" * 5000
    lines = [{**chat_line(i), "body": {"model": long + str(i), "messages": []}} for i in range(400)]
    errs = _errors(services, jsonl(lines))
    size = sum(len(e.model_dump_json()) for e in errs)
    assert len(errs) < 400 and MAX_ERRORS_BYTES <= size < MAX_ERRORS_BYTES + 1024


def _est(services: Services, body: dict) -> int:
    batch_id = make_batch(services, jsonl([{**chat_line(1), "body": {**chat_line(1)["body"], **body}}]))
    assert validate_batch(BatchTaskInput(batch_id=batch_id), services).valid
    return int(services.adapters.table.get(batch_id)["est_tokens"])


def test_n_and_best_of_multiply_the_token_estimate(services: Services) -> None:
    """L6: each choice is GPU work, so the queue limits count it."""
    one = _est(services, {"max_tokens": 1000})
    assert _est(services, {"max_tokens": 1000, "n": 8}) - one >= 7000
    assert _est(services, {"max_tokens": 1000, "n": 2, "best_of": 5}) - one >= 4000


def test_n_is_capped_by_a_setting(services: Services) -> None:
    services.settings.validation.max_choices_per_request = 4
    for body, param in (({"n": 5}, "body.n"), ({"best_of": 50}, "body.best_of"), ({"n": 0}, "body.n"),
                        ({"n": "3"}, "body.n")):
        [err] = _errors(services, jsonl([{**chat_line(1), "body": {**chat_line(1)["body"], **body}}]))
        assert (err.code, err.param) == ("invalid_value", param), body
    assert _est(services, {"n": 4}) > 0


def test_an_embeddings_request_is_capped_in_inputs(services: Services) -> None:
    """L4: OpenAI's 2048 inputs per embeddings request (settable)."""
    services.settings.validation.max_embedding_inputs_per_request = 3
    line = {"custom_id": "e", "method": "POST", "url": "/v1/embeddings",
            "body": {"model": "all-MiniLM-L6-v2", "input": ["a", "b", "c", "d"]}}
    batch_id = make_batch(services, jsonl([line]), endpoint="/v1/embeddings")
    assert validate_batch(BatchTaskInput(batch_id=batch_id), services).valid is False
    [err] = services.batches.get("default", batch_id).errors.data
    assert (err.code, err.line) == ("too_many_inputs", 1) and "at most 3" in err.message


def _image(url: str) -> dict:
    line = chat_line(1)
    line["body"]["messages"] = [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": url}}]}]
    return line


def test_media_urls_are_data_urls_unless_a_domain_is_allowed(services: Services) -> None:
    """L7: the engine would fetch any URL a tenant names, from inside the VPC."""
    for url in ("http://169.254.169.254/latest/meta-data/", "https://evil.example/x.png", "file:///etc/passwd",
                "https://media.example.com@evil.example/x.png"):
        [err] = _errors(services, jsonl([_image(url)]))
        assert err.code == "invalid_value" and err.param == "body.messages[0].content[1].image_url.url", url
    batch_id = make_batch(services, jsonl([_image("data:image/png;base64,iVBORw0KGgo=")]))
    assert validate_batch(BatchTaskInput(batch_id=batch_id), services).valid
    services.settings.validation.media_allowed_domains = "media.example.com"
    batch_id = make_batch(services, jsonl([_image("https://media.example.com/cat.png")]))
    assert validate_batch(BatchTaskInput(batch_id=batch_id), services).valid
    [err] = _errors(services, jsonl([_image("https://evil.example/x.png")]))
    assert "media.example.com" in err.message
