"""Score and rerank lines through Validate: vLLM's bodies accepted, bad ones failed with a code, line and param."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nightbatch.pipeline import BatchTaskInput, validate_batch
from nightbatch.settings import SETTINGS
from nightbatch.wiring import Services
from tests.support.pipeline_world import chat_line, jsonl, make_batch, overridden

EMBED = "all-MiniLM-L6-v2"
SCORE, RERANK = "/v1/score", "/v1/rerank"
CROSS_ENCODER = json.dumps([{"name": "ms-marco", "source": "/models/ms-marco", "task": "score"}])


def score(i: int, model: str = EMBED, **body: Any) -> dict[str, Any]:
    b = {"model": model, "text_1": "What is the capital of France?", "text_2": ["Paris is.", "Berlin is not."]}
    return {"custom_id": f"s{i}", "method": "POST", "url": SCORE, "body": overridden(b, body)}


def rerank(i: int, model: str = EMBED, **body: Any) -> dict[str, Any]:
    b = {"model": model, "query": "capital of France", "documents": ["Paris", "Berlin", "Rome"], "top_n": 2}
    return {"custom_id": f"r{i}", "method": "POST", "url": RERANK, "body": overridden(b, body)}


def _validate(services: Services, lines: list[dict[str, Any]], endpoint: str) -> str:
    batch_id = make_batch(services, jsonl(lines), endpoint=endpoint)
    validate_batch(BatchTaskInput(batch_id=batch_id), services)
    return batch_id


def _errors(services: Services, lines: list[dict[str, Any]], endpoint: str) -> list[Any]:
    batch = services.batches.get("default", _validate(services, lines, endpoint))
    assert batch.status == "failed" and batch.errors is not None, batch.status
    return list(batch.errors.data)


def _est(services: Services, line: dict[str, Any], endpoint: str) -> int:
    batch_id = _validate(services, [line], endpoint)
    assert services.batches.get("default", batch_id).status != "failed"
    return int(services.adapters.table.get(batch_id)["est_tokens"])


ACCEPTED = [
    ("text pair, 1:N", SCORE, score(1)),
    ("text pair, 1:1 strings", SCORE, score(1, text_2="Paris is.")),
    ("text pair, N:N", SCORE, score(1, text_1=["a", "b"], text_2=["c", "d"])),
    ("queries/documents", SCORE, score(1, text_1=..., text_2=..., queries="q", documents=["a", "b"])),
    ("queries/items", SCORE, score(1, text_1=..., text_2=..., queries=["q"], items=["a"])),
    ("data_1/data_2", SCORE, score(1, text_1=..., text_2=..., data_1="q", data_2="a")),
    ("content objects", SCORE, score(1, text_2=[{"content": [{"type": "text", "text": "Paris"}]}])),
    ("rerank", RERANK, rerank(1)),
    ("rerank without top_n", RERANK, rerank(1, top_n=...)),
    ("rerank one document", RERANK, rerank(1, documents="Paris", top_n=0)),
]


@pytest.mark.parametrize(("endpoint", "line"), [c[1:] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED])
def test_vllm_score_and_rerank_bodies_validate(services: Services, endpoint: str, line: dict[str, Any]) -> None:
    batch_id = make_batch(services, jsonl([line, {**line, "custom_id": "second"}]), endpoint=endpoint)
    assert validate_batch(BatchTaskInput(batch_id=batch_id), services).valid


BAD: list[tuple[str, str, dict[str, Any], str, str]] = [
    ("score without sides", SCORE, score(2, text_1=..., text_2=...), "missing_required_parameter", "body.queries"),
    ("score with one side", SCORE, score(2, text_2=...), "missing_required_parameter", "body.text_2"),
    ("documents without queries", SCORE, score(2, text_1=..., text_2=..., documents=["a"]),
     "missing_required_parameter", "body.queries"),
    ("two pairs", SCORE, score(2, queries="q", documents=["a"]), "invalid_request", "body.text_1"),
    ("empty side", SCORE, score(2, text_2=[]), "invalid_request", "body.text_2"),
    ("number in a side", SCORE, score(2, text_2=["ok", 7]), "invalid_request", "body.text_2[1]"),
    ("object without content", SCORE, score(2, text_1={"text": "q"}), "invalid_request", "body.text_1"),
    ("N:M sides", SCORE, score(2, text_1=["a", "b"], text_2=["c", "d", "e"]), "invalid_request", "body.text_2"),
    ("rerank without query", RERANK, rerank(2, query=...), "missing_required_parameter", "body.query"),
    ("rerank without documents", RERANK, rerank(2, documents=...), "missing_required_parameter", "body.documents"),
    ("rerank with a list query", RERANK, rerank(2, query=["a", "b"]), "invalid_request", "body.query"),
    ("rerank query a number", RERANK, rerank(2, query=3), "invalid_request", "body.query"),
    ("rerank empty documents", RERANK, rerank(2, documents=[]), "invalid_request", "body.documents"),
    ("rerank negative top_n", RERANK, rerank(2, top_n=-1), "invalid_value", "body.top_n"),
    ("rerank top_n a string", RERANK, rerank(2, top_n="2"), "invalid_value", "body.top_n"),
    ("rerank top_n true", RERANK, rerank(2, top_n=True), "invalid_value", "body.top_n"),
    ("chat model", SCORE, score(2, model="SmolLM2-135M-Instruct"), "model_not_found", "body.model"),
    ("streaming", RERANK, rerank(2, stream=True), "streaming_unsupported", "body.stream"),
    ("media URL", RERANK, rerank(2, documents=["a", {"content": [
        {"type": "image_url", "image_url": {"url": "http://169.254.169.254/latest/meta-data/"}}]}]),
     "invalid_value", "body.documents[1].content[0].image_url.url"),
    ("media URL in a single query", RERANK, rerank(2, query={"content": [
        {"type": "image_url", "image_url": {"url": "https://evil.example/x.png"}}]}),
     "invalid_value", "body.query.content[0].image_url.url"),
]


@pytest.mark.parametrize(("endpoint", "line", "code", "param"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_score_and_rerank_lines_fail_with_code_line_and_param(
    services: Services, endpoint: str, line: dict[str, Any], code: str, param: str
) -> None:
    good = score(1) if endpoint == SCORE else rerank(1)
    [err] = _errors(services, [good, line], endpoint)
    assert (err.code, err.line, err.param) == (code, 2, param), err
    assert err.message and len(err.message) < 400


def test_documents_per_line_are_capped_by_a_setting(services: Services) -> None:
    SETTINGS["max_score_documents_per_request"].set(services.settings, 3)
    [err] = _errors(services, [rerank(1), rerank(2, documents=["a", "b", "c", "d"])], RERANK)
    assert (err.code, err.line, err.param) == ("too_many_inputs", 2, "body.documents")
    assert "at most 3" in err.message
    [err] = _errors(services, [score(1, text_1=["a"] * 4, text_2=["b"] * 4)], SCORE)
    assert (err.code, err.line) == ("too_many_inputs", 1)
    assert _est(services, rerank(3, documents=["a", "b", "c"]), RERANK) > 0


def test_a_score_line_on_another_endpoint_is_refused(services: Services) -> None:
    [err] = _errors(services, [rerank(1), score(2)], RERANK)
    assert (err.code, err.line) == ("invalid_url", 2)
    [err] = _errors(services, [chat_line(1), rerank(2)], "/v1/chat/completions")
    assert (err.code, err.line) == ("invalid_url", 2)


def test_a_cross_encoder_counts_the_query_once_per_document(services: Services) -> None:
    """A cross-encoder reads the query with every document; an embedding model encodes it once."""
    query = "q" * 4000
    bi = _est(services, rerank(1, query=query, documents=["a"] * 10), RERANK)
    SETTINGS["models_json"].set(services.settings, CROSS_ENCODER)
    cross = _est(services, rerank(1, model="ms-marco", query=query, documents=["a"] * 10), RERANK)
    assert cross - bi >= 9 * 1000
    # A query given as content parts is read with every document just the same.
    parts = {"content": [{"type": "text", "text": query}]}
    as_parts = _est(services, rerank(1, model="ms-marco", query=parts, documents=["a"] * 10), RERANK)
    assert as_parts - bi >= 9 * 1000 and abs(as_parts - cross) < 0.01 * cross


def test_a_scoring_model_serves_only_score_and_rerank(services: Services) -> None:
    SETTINGS["models_json"].set(services.settings, CROSS_ENCODER)
    assert _est(services, score(1, model="ms-marco"), SCORE) > 0
    emb = {"custom_id": "e", "method": "POST", "url": "/v1/embeddings", "body": {"model": "ms-marco", "input": "x"}}
    [err] = _errors(services, [emb], "/v1/embeddings")
    assert err.code == "model_not_found" and "Served models: none" in err.message
