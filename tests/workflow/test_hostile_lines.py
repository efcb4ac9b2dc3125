"""L2: hostile input lines end as clear per-line errors, echo little, and cannot bloat a batch's error list."""

from __future__ import annotations

from nightbatch.pipeline import BatchTaskInput, validate_batch
from nightbatch.services import Services
from nightbatch.validation import MAX_ERRORS_BYTES
from tests.workflow.conftest import chat_line, jsonl, make_batch


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
