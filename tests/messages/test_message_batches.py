# ruff: noqa: F811  (the `services` fixture is imported from tests/support/pipeline_world.py, then requested)
"""A Message Batch (the Anthropic wire) through Validate → Plan → results written by the test → Finalize: its
counts as Anthropic names them and its result lines made from our files."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nightbatch import layout
from nightbatch.aws.records import BatchRecord
from nightbatch.files.downloads import Redirect
from nightbatch.ids import new_request_id
from nightbatch.messages import service
from nightbatch.messages.objects import CreateMessageBatch, MessageBatch, batch_id_of
from nightbatch.messages.results import result_of
from nightbatch.pipeline import BatchTaskInput, finalize_batch, validate_batch
from nightbatch.results import lines as results
from nightbatch.wiring import Services
from tests.pipeline.test_pipeline import run_to_shards
from tests.support.pipeline_world import (
    services,  # noqa: F401  (the pipeline's world on moto)
    shard_requests_of,
)

MODEL = "SmolLM2-135M-Instruct"


def requests(n: int) -> CreateMessageBatch:
    return CreateMessageBatch.model_validate({"requests": [
        {"custom_id": f"q-{i}", "params": {"model": MODEL, "max_tokens": 8, "system": "Be brief.",
                                           "messages": [{"role": "user", "content": f"Say {i}"}]}}
        for i in range(n)]})


def message(n: int) -> dict[str, Any]:
    return {"id": f"msg_{n}", "type": "message", "role": "assistant", "model": MODEL,
            "content": [{"type": "text", "text": f"a{n}"}], "stop_reason": "end_turn",
            "usage": {"input_tokens": 5, "output_tokens": 2}}


def answer(services: Services, batch_id: str, shard_id: str, *, ok: set[str], failed: set[str]) -> None:
    """What a worker writes for the custom_ids in `ok` (a Message) and `failed` (the engine's 400); the rest
    stay unrun."""
    out = []
    for req in shard_requests_of(services, batch_id, shard_id):
        if req.custom_id in ok:
            response = results.Response(200, new_request_id(), message(req.number))
        elif req.custom_id in failed:
            response = results.Response(400, new_request_id(), {"error": {
                "message": "prompt too long", "type": "BadRequestError", "param": None, "code": 400}})
        else:
            continue
        out.append(results.encode(batch_id, req.custom_id, response=response))
    services.adapters.blobs.put_bytes(layout.results_prefix(batch_id, shard_id) + "000000-a.jsonl", b"".join(out))


def result_types(services: Services, mb: MessageBatch) -> dict[str, dict[str, Any]]:
    served = service.results(services, "default", mb.id)
    assert not isinstance(served, Redirect)  # no inline limit here
    rows = [json.loads(x) for x in b"".join(served).splitlines()]
    assert len(rows) == len({r["custom_id"] for r in rows})
    return {r["custom_id"]: r["result"] for r in rows}


def test_created_batch_is_an_input_file_of_messages_lines(services: Services) -> None:
    mb = service.create(services, "default", requests(3))
    rec = services.adapters.table.get_record(BatchRecord, batch_id_of(mb.id))
    assert rec is not None and rec.wire == "anthropic" and rec.endpoint == "/v1/messages"
    assert mb.processing_status == "in_progress" and mb.request_counts.processing == 3
    item = services.files.item("default", rec.input_file_id)
    lines = [json.loads(x) for x in b"".join(services.files.chunks(item)).splitlines()]
    assert [(x["custom_id"], x["method"], x["url"]) for x in lines] == [
        (f"q-{i}", "POST", "/v1/messages") for i in range(3)]
    assert lines[0]["body"]["system"] == "Be brief." and item.bytes == sum(len(json.dumps(x, separators=(
        ",", ":"), ensure_ascii=False)) + 1 for x in lines)
    assert services.batches.workflow.started == [rec.pk]  # type: ignore[attr-defined]


def test_cancel_mid_run_counts_and_results_as_anthropic_names_them(services: Services) -> None:
    mb = service.create(services, "default", requests(6))
    batch_id = batch_id_of(mb.id)
    assert batch_id is not None
    [shard] = run_to_shards(services, batch_id)
    answer(services, batch_id, shard, ok={"q-0", "q-1", "q-2"}, failed={"q-3"})
    canceling = service.cancel(services, "default", mb.id)
    assert canceling.processing_status == "canceling" and canceling.cancel_initiated_at is not None
    assert canceling.request_counts.processing == 6 and canceling.results_url is None
    finalize_batch(BatchTaskInput(batch_id=batch_id), services)
    ended = service.get(services, "default", mb.id)
    assert ended.processing_status == "ended" and ended.ended_at is not None
    assert ended.request_counts.model_dump() == {"processing": 0, "succeeded": 3, "errored": 1, "canceled": 2,
                                                 "expired": 0}
    assert ended.results_url == f"/v1/messages/batches/{mb.id}/results"
    got = result_types(services, ended)
    assert {k: v["type"] for k, v in got.items()} == {
        "q-0": "succeeded", "q-1": "succeeded", "q-2": "succeeded", "q-3": "errored", "q-4": "canceled",
        "q-5": "canceled"}
    assert got["q-0"]["message"] == message(1)
    assert got["q-3"]["error"] == {"type": "error", "error": {"type": "invalid_request_error",
                                                              "message": "prompt too long"}}
    assert got["q-4"] == {"type": "canceled"}


def test_expired_requests_are_expired(services: Services) -> None:
    mb = service.create(services, "default", requests(3))
    batch_id = batch_id_of(mb.id)
    assert batch_id is not None
    [shard] = run_to_shards(services, batch_id)
    answer(services, batch_id, shard, ok={"q-0"}, failed=set())
    services.adapters.table.update(batch_id, set_={"expires_at": 0})
    finalize_batch(BatchTaskInput(batch_id=batch_id), services)
    ended = service.get(services, "default", mb.id)
    assert ended.request_counts.model_dump() == {"processing": 0, "succeeded": 1, "errored": 0, "canceled": 0,
                                                 "expired": 2}
    assert {k: v["type"] for k, v in result_types(services, ended).items()} == {
        "q-0": "succeeded", "q-1": "expired", "q-2": "expired"}


def test_input_refused_as_a_whole_errors_every_request(services: Services) -> None:
    mb = service.create(services, "default", requests(2))
    batch_id = batch_id_of(mb.id)
    assert batch_id is not None
    services.settings.validation.max_input_bytes = 10  # refused at Validate, after create accepted it
    assert not validate_batch(BatchTaskInput(batch_id=batch_id), services).valid
    ended = service.get(services, "default", mb.id)
    assert ended.processing_status == "ended" and ended.request_counts.errored == 2
    got = result_types(services, ended)
    assert set(got) == {"q-0", "q-1"}
    assert all(r["type"] == "errored" and "over the limit" in r["error"]["error"]["message"] for r in got.values())


@pytest.mark.parametrize(("line", "expected"), [
    ({"custom_id": "a", "error": {"code": "shard_failed", "message": "lost"}, "response": None},
     {"type": "errored", "error": {"type": "error", "error": {"type": "api_error", "message": "lost"}}}),
    ({"custom_id": "a", "error": None, "response": {"status_code": 404, "body": {"error": {"message": "no"}}}},
     {"type": "errored", "error": {"type": "error", "error": {"type": "not_found_error", "message": "no"}}}),
    ({"custom_id": "a", "error": {"code": "batch_expired", "message": "x"}, "response": None}, {"type": "expired"}),
])
def test_result_of_each_kind_of_line(line: dict[str, Any], expected: dict[str, Any]) -> None:
    assert result_of(line) == expected
