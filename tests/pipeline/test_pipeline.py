"""Validate → Plan → (results written by the test, no engine) → Finalize, and their idempotency."""

from __future__ import annotations

import json
from typing import Any

from nightbatch import layout
from nightbatch.batches import lifecycle
from nightbatch.ids import new_request_id
from nightbatch.pipeline import BatchTaskInput, finalize_batch, plan_batch, validate_batch
from nightbatch.results import lines as results
from nightbatch.wiring import Services
from tests.support.openai_lines import BatchRequestOutput
from tests.support.pipeline_world import chat_line, jsonl, make_batch, shard_requests_of


def write_results(services: Services, batch_id: str, shard_id: str, *, fail_every: int = 0,
                  skip: set[str] | None = None) -> None:
    blobs = services.adapters.blobs
    out = []
    for line in shard_requests_of(services, batch_id, shard_id):
        if skip and line.custom_id in skip:
            continue
        n = line.number
        status = 400 if fail_every and n % fail_every == 0 else 200
        body: dict[str, Any] = (
            {"error": {"message": "bad", "type": "BadRequestError", "param": None, "code": 400}}
            if status != 200 else
            {"object": "chat.completion", "choices": [{"message": {"content": f"a{n}"}}],
             "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}})
        out.append(results.encode(batch_id, line.custom_id,
                                  response=results.Response(status, new_request_id(), body)))
    blobs.put_bytes(layout.results_prefix(batch_id, shard_id) + "000000-a.jsonl", b"".join(out))
    if not skip:
        blobs.put_bytes(layout.done_key(batch_id, shard_id), b"{}")


def run_to_shards(services: Services, batch_id: str) -> list[str]:
    inp = BatchTaskInput(batch_id=batch_id)
    assert validate_batch(inp, services).valid
    plan = plan_batch(inp, services)
    items = json.loads(services.adapters.blobs.get_bytes(plan.manifest_key) or b"[]")
    assert len(items) == plan.shard_count
    return [i["shard_id"] for i in items]


def read_file(services: Services, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    item = services.files.item("default", file_id)
    data = b"".join(services.files.chunks(item))
    return [json.loads(x) for x in data.splitlines()]


def test_valid_batch_completes_with_one_line_per_input(services: Services) -> None:
    services.settings.pipeline.shard_target_tokens = 50
    batch_id = make_batch(services, jsonl([chat_line(i) for i in range(1, 31)]))
    shards = run_to_shards(services, batch_id)
    assert len(shards) > 1
    for s in shards:
        write_results(services, batch_id, s, fail_every=10)
    out = finalize_batch(BatchTaskInput(batch_id=batch_id), services)
    assert out.status == "completed"
    batch = services.batches.get("default", batch_id)
    ok, bad = read_file(services, batch.output_file_id), read_file(services, batch.error_file_id)
    assert len(ok) == 27 and len(bad) == 3
    assert sorted(x["custom_id"] for x in ok + bad) == sorted(f"req-{i}" for i in range(1, 31))
    for line in ok + bad:
        BatchRequestOutput.model_validate(line)
    assert batch.request_counts.model_dump() == {"total": 30, "completed": 27, "failed": 3}
    assert batch.usage is not None and batch.usage.input_tokens == 27 * 3
    assert batch.completed_at and batch.finalizing_at and batch.in_progress_at


def test_finalize_twice_is_idempotent(services: Services) -> None:
    batch_id = make_batch(services, jsonl([chat_line(i) for i in range(1, 6)]))
    for s in run_to_shards(services, batch_id):
        write_results(services, batch_id, s)
    finalize_batch(BatchTaskInput(batch_id=batch_id), services)
    first = services.batches.get("default", batch_id)
    data1 = services.adapters.blobs.get_bytes(layout.output_key(batch_id))
    # A retried Finalize after the transition: no second transition, same files.
    finalize_batch(BatchTaskInput(batch_id=batch_id), services)
    assert services.batches.get("default", batch_id) == first
    assert services.adapters.blobs.get_bytes(layout.output_key(batch_id)) == data1


def test_shard_without_results_ends_as_shard_failed(services: Services) -> None:
    services.settings.pipeline.shard_target_tokens = 50
    batch_id = make_batch(services, jsonl([chat_line(i) for i in range(1, 21)]))
    shards = run_to_shards(services, batch_id)
    write_results(services, batch_id, shards[0])
    finalize_batch(BatchTaskInput(batch_id=batch_id), services)
    batch = services.batches.get("default", batch_id)
    assert batch.status == "completed"
    bad = read_file(services, batch.error_file_id)
    assert bad and all(x["error"]["code"] == "shard_failed" and x["response"] is None for x in bad)
    assert batch.request_counts.total == 20
    assert len(read_file(services, batch.output_file_id)) + len(bad) == 20


def test_cancel_mid_run_writes_partial_and_cancelled_lines(services: Services) -> None:
    batch_id = make_batch(services, jsonl([chat_line(i) for i in range(1, 11)]))
    shards = run_to_shards(services, batch_id)
    write_results(services, batch_id, shards[0], skip={f"req-{i}" for i in range(6, 11)})
    services.batches.cancel("default", batch_id)
    finalize_batch(BatchTaskInput(batch_id=batch_id), services)
    batch = services.batches.get("default", batch_id)
    assert batch.status == "cancelled" and batch.cancelled_at
    bad = read_file(services, batch.error_file_id)
    assert {x["error"]["code"] for x in bad} == {"batch_cancelled"} and len(bad) == 5
    assert batch.request_counts.model_dump() == {"total": 10, "completed": 5, "failed": 5}


def test_expiry_writes_batch_expired(services: Services) -> None:
    batch_id = make_batch(services, jsonl([chat_line(i) for i in range(1, 5)]))
    run_to_shards(services, batch_id)
    services.adapters.table.update(batch_id, set_={"expires_at": 0})
    finalize_batch(BatchTaskInput(batch_id=batch_id), services)
    batch = services.batches.get("default", batch_id)
    assert batch.status == "expired" and batch.expired_at and batch.output_file_id is None
    bad = read_file(services, batch.error_file_id)
    assert [x["error"]["code"] for x in bad] == ["batch_expired"] * 4


def test_invalid_input_fails_with_line_errors(services: Services) -> None:
    payload = jsonl([chat_line(1), chat_line(1)]) + b"{not json\n\n" + jsonl([chat_line(3, model="nope")])
    batch_id = make_batch(services, payload)
    assert not validate_batch(BatchTaskInput(batch_id=batch_id), services).valid
    batch = services.batches.get("default", batch_id)
    assert batch.status == "failed" and batch.failed_at and batch.output_file_id is None
    assert batch.errors is not None
    got = [(e.code, e.line) for e in batch.errors.data]
    assert got == [("duplicate_custom_id", 2), ("invalid_json_line", 3), ("model_not_found", 5)]
    assert batch.request_counts.model_dump() == {"total": 0, "completed": 0, "failed": 0}


def test_cancel_while_validating_then_finalize(services: Services) -> None:
    batch_id = make_batch(services, jsonl([chat_line(i) for i in range(1, 4)]))
    lifecycle.transition(services.adapters.table, batch_id, "cancelling")
    assert validate_batch(BatchTaskInput(batch_id=batch_id), services).valid
    plan_batch(BatchTaskInput(batch_id=batch_id), services)
    finalize_batch(BatchTaskInput(batch_id=batch_id), services)
    batch = services.batches.get("default", batch_id)
    assert batch.status == "cancelled"
    assert batch.request_counts.model_dump() == {"total": 3, "completed": 0, "failed": 3}
    assert [x["error"]["code"] for x in read_file(services, batch.error_file_id)] == ["batch_cancelled"] * 3
