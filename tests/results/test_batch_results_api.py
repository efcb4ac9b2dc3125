"""GET /v1/nightbatch/batches/{id}/results and POST …/retry over real HTTP with the OpenAI SDK: headers,
another tenant's batch, OpenAI-style refusals, Idempotency-Key."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from nightbatch import layout
from nightbatch.pipeline import BatchTaskInput, finalize_batch
from tests.pipeline.test_pipeline import run_to_shards
from tests.results.test_partial_results import result
from tests.support.tenant_stack import Stack, chat_lines

CHAT = "/v1/chat/completions"


@pytest.fixture
def stack(make_stack: Any) -> Stack:
    s: Stack = make_stack()
    return s


def results(client: openai.OpenAI, batch_id: str, kind: str = "output") -> httpx.Response:
    return client.get(f"/nightbatch/batches/{batch_id}/results", cast_to=httpx.Response,
                      options={"params": {"kind": kind}})


def running_batch(stack: Stack, client: openai.OpenAI) -> str:
    f = client.files.create(file=("in.jsonl", chat_lines(6)), purpose="batch")
    batch = client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")
    shard = run_to_shards(stack.services, batch.id)[0]
    prefix = layout.results_prefix(batch.id, shard)
    stack.services.adapters.blobs.put_bytes(layout.checkpoint_key(prefix, 0, "a"), b"".join(
        result(batch.id, f"req-{i}", 200, f"a{i}") for i in range(3)))
    stack.services.adapters.table.update(batch.id, add={"live_completed": 3})
    return batch.id


def test_partial_then_final_results_over_http(stack: Stack) -> None:
    client = stack.client(stack.new_key("team-a"))
    batch_id = running_batch(stack, client)
    r = results(client, batch_id)
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/jsonl")
    assert (r.headers["x-nightbatch-complete"], r.headers["x-nightbatch-count"]) == ("false", "3")
    assert r.headers["x-nightbatch-status"] == "in_progress"
    partial = r.content.splitlines()
    assert [json.loads(x)["custom_id"] for x in partial] == ["req-0", "req-1", "req-2"]
    print("\npartial read:", {k: v for k, v in r.headers.items() if k.startswith("x-nightbatch")},
          partial[0][:120])

    # Another tenant's batch is answered as a missing one; a bad kind is a 400 naming the param.
    other = stack.client(stack.new_key("team-b"))
    with pytest.raises(openai.NotFoundError):
        results(other, batch_id)
    with pytest.raises(openai.BadRequestError) as bad:
        results(client, batch_id, "everything")
    assert bad.value.body["param"] == "kind"  # type: ignore[index]

    client.batches.cancel(batch_id)
    finalize_batch(BatchTaskInput(batch_id=batch_id), stack.services)
    r = results(client, batch_id)
    assert (r.headers["x-nightbatch-complete"], r.headers["x-nightbatch-count"]) == ("true", "3")
    assert r.content.splitlines() == partial
    errors = results(client, batch_id, "error")
    assert errors.headers["x-nightbatch-count"] == "3" and len(errors.content.splitlines()) == 3


def test_retry_over_http_with_idempotency_key(stack: Stack) -> None:
    client = stack.client(stack.new_key("team-a"), max_retries=2)
    batch_id = running_batch(stack, client)
    with pytest.raises(openai.ConflictError) as early:
        client.post(f"/nightbatch/batches/{batch_id}/retry", cast_to=dict, body={})
    assert early.value.code == "batch_not_ended" and "in_progress" in early.value.message

    client.batches.cancel(batch_id)
    finalize_batch(BatchTaskInput(batch_id=batch_id), stack.services)
    key = {"Idempotency-Key": "retry-1"}
    first = client.post(f"/nightbatch/batches/{batch_id}/retry", cast_to=dict, body={}, options={"headers": key})
    again = client.post(f"/nightbatch/batches/{batch_id}/retry", cast_to=dict, body={}, options={"headers": key})
    assert again == first and first["nightbatch"] == {"retry_of": batch_id, "retry_lines": 3}
    assert client.batches.retrieve(batch_id).model_extra["nightbatch"]["retried_by"] == [first["id"]]  # type: ignore[index]
    assert first["id"] in stack.workflow.started and stack.workflow.started.count(first["id"]) == 1

    with pytest.raises(openai.BadRequestError) as none:
        client.post(f"/nightbatch/batches/{batch_id}/retry", cast_to=dict, body={"error_codes": ["shard_failed"]})
    assert none.value.code == "no_matching_lines"
    with pytest.raises(openai.BadRequestError) as unknown:  # a misspelt field is refused, not ignored
        client.post(f"/nightbatch/batches/{batch_id}/retry", cast_to=dict, body={"error_code": ["shard_failed"]})
    assert "error_code" in unknown.value.message
    other = stack.client(stack.new_key("team-b"))
    with pytest.raises(openai.NotFoundError):
        other.post(f"/nightbatch/batches/{batch_id}/retry", cast_to=dict, body={})
