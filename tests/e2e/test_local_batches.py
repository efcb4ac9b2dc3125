"""The OpenAI SDK drives real batches through `nightbatch local` on the real CPU engines."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from openai import OpenAI
from openai.types import Batch

from tests.e2e.conftest import LocalStack
from tests.e2e.sdk import submit, wait, wait_for_a_result
from tests.support.openai_lines import BatchRequestOutput

pytestmark = pytest.mark.e2e
CHAT = "SmolLM2-135M-Instruct"
EMBED = "all-MiniLM-L6-v2"
# Requests that outlast the 20 s test "hour" plus its drain on an idle machine too: 40 lines x 400 tokens
# finished inside the window there, so expiry had no unrun lines to mark. The chat model allows 2048 tokens.
LONG_TOKENS = 1500


def lines_of(client: OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    rows = [json.loads(x) for x in client.files.content(file_id).text.splitlines()]
    for row in rows:
        BatchRequestOutput.model_validate(row)  # every line re-parsed with the output-line model
    return rows


def chat(i: int, content: str, **body: Any) -> dict[str, Any]:
    return {"custom_id": f"chat-{i}", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": CHAT, "messages": [{"role": "user", "content": content}], "temperature": 0, **body}}


def assert_one_line_per_input(batch: Batch, ok: list[dict[str, Any]], bad: list[dict[str, Any]], n: int) -> None:
    ids = [r["custom_id"] for r in ok + bad]
    assert len(ids) == len(set(ids)) == n
    assert batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (
        n, len(ok), len(bad))


def test_chat_batch_completes_with_real_model_output(local_stack: LocalStack) -> None:
    client = local_stack.client()
    lines = [chat(i, f"Name a colour. Number {i}.", max_tokens=12) for i in range(10)]
    # Longer than the model's context: vLLM's serving layer rejects it; the line lands in the error file.
    lines.append(chat(99, "word " * 3000, max_tokens=8))
    batch = wait(client, submit(client, lines, "/v1/chat/completions").id)
    assert batch.status == "completed", batch
    ok, bad = lines_of(client, batch.output_file_id), lines_of(client, batch.error_file_id)
    assert_one_line_per_input(batch, ok, bad, 11)
    assert [r["custom_id"] for r in bad] == ["chat-99"]
    assert bad[0]["response"]["status_code"] == 400 and bad[0]["response"]["body"]["error"]["message"]
    for r in ok:
        body = r["response"]["body"]
        assert r["response"]["status_code"] == 200 and body["object"] == "chat.completion"
        assert body["model"] == CHAT and body["choices"][0]["message"]["content"].strip()
        assert 0 < body["usage"]["completion_tokens"] <= 12
    assert batch.usage is not None
    assert batch.usage.output_tokens == sum(r["response"]["body"]["usage"]["completion_tokens"] for r in ok)
    assert batch.model == CHAT and batch.completed_at and batch.in_progress_at


def test_completions_batch(local_stack: LocalStack) -> None:
    client = local_stack.client()
    lines = [{"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions",
              "body": {"model": CHAT, "prompt": f"The number {i} is", "max_tokens": 8}} for i in range(5)]
    batch = wait(client, submit(client, lines, "/v1/completions").id)
    ok = lines_of(client, batch.output_file_id)
    assert batch.status == "completed" and batch.error_file_id is None
    assert_one_line_per_input(batch, ok, [], 5)
    assert all(r["response"]["body"]["object"] == "text_completion" for r in ok)


def test_embeddings_batch(local_stack: LocalStack) -> None:
    client = local_stack.client()
    lines = [{"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings",
              "body": {"model": EMBED, "input": [f"sentence {i}", "another one"]}} for i in range(6)]
    batch = wait(client, submit(client, lines, "/v1/embeddings").id)
    ok = lines_of(client, batch.output_file_id)
    assert batch.status == "completed"
    assert_one_line_per_input(batch, ok, [], 6)
    for r in ok:
        data = r["response"]["body"]["data"]
        assert len(data) == 2 and len(data[0]["embedding"]) == 384


def test_cancel_mid_run_keeps_partial_results(local_stack: LocalStack) -> None:
    client = local_stack.client()
    n = 40
    # A few short requests finish at once; the long ones are still running when the cancel arrives.
    lines = [chat(i, f"Write a long story about the number {i}.", max_tokens=4) if i < 4 else
             chat(i, f"Write a long story about the number {i}.", max_tokens=LONG_TOKENS, ignore_eos=True)
             for i in range(n)]
    batch = submit(client, lines, "/v1/chat/completions")
    wait_for_a_result(client, batch.id)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at
    done = wait(client, batch.id)
    assert done.status == "cancelled" and done.cancelled_at
    ok, bad = lines_of(client, done.output_file_id), lines_of(client, done.error_file_id)
    assert_one_line_per_input(done, ok, bad, n)
    assert ok, "requests finished before the cancel are kept"
    assert {r["error"]["code"] for r in bad if r["response"] is None} == {"batch_cancelled"}


def test_expiry_with_a_short_hour(local_stack: LocalStack) -> None:
    client = local_stack.client()
    n = 40
    # ~60k tokens with ignore_eos: longer than the 20 s window (plus drain) on any CPU this runs on.
    lines = [chat(i, f"Write a long essay about topic {i}.", max_tokens=LONG_TOKENS, ignore_eos=True) for i in range(n)]
    batch = submit(client, lines, "/v1/chat/completions", window="1h")  # one "hour" is 20 s here
    assert batch.expires_at == batch.created_at + 20
    done = wait(client, batch.id)
    assert done.status == "expired" and done.expired_at
    ok, bad = lines_of(client, done.output_file_id), lines_of(client, done.error_file_id)
    assert_one_line_per_input(done, ok, bad, n)
    expired = [r for r in bad if r["response"] is None]
    assert expired and {r["error"]["code"] for r in expired} == {"batch_expired"}


def test_usage_and_cost_are_reported(local_stack: LocalStack) -> None:
    client = local_stack.client()
    batch = wait(client, submit(client, [chat(1, "Hi", max_tokens=4)], "/v1/chat/completions").id)
    assert batch.status == "completed"
    extra = batch.model_extra or {}
    cost = (extra.get("nightbatch") or {}).get("cost")
    assert cost and cost["gpu_seconds"] > 0 and cost["estimate"] is True
    # The engine reports cached prompt tokens, so the batch has a prompt-cache hit rate.
    assert 0 <= (extra.get("nightbatch") or {})["prompt_cache_hit_rate"] <= 1
    # Phase timings of the shard's attempt (the local stack's engine is shared, so weights come from "local").
    phases = (extra.get("nightbatch") or {}).get("phases")
    assert phases and phases["attempts"] >= 1 and phases["weights_sources"] == {"local": phases["attempts"]}
    assert 0 <= phases["median_s"]["engine_ready"] <= phases["median_s"]["first_result"] <= phases["median_s"]["done"]
    r = httpx.get(f"{local_stack.base_url}/nightbatch/usage",
                  headers={"Authorization": f"Bearer {local_stack.api_key}"})
    usage = r.json()
    assert r.status_code == 200 and usage["object"] == "nightbatch.usage"
    assert usage["batches"] >= 1 and usage["output_tokens"] > 0


def test_partial_results_then_cancel_then_retry_covers_every_line_once(local_stack: LocalStack) -> None:
    client = local_stack.client()
    n = 20
    # Four short requests finish at once; the long ones are still running at the partial read and the cancel.
    lines = [chat(i, f"Count slowly from {i}.", max_tokens=4) if i < 4 else
             chat(i, f"Write a long story about the number {i}.", max_tokens=512, ignore_eos=True)
             for i in range(n)]
    batch = submit(client, lines, "/v1/chat/completions")
    wait_for_a_result(client, batch.id)
    partial = client.get(f"/nightbatch/batches/{batch.id}/results", cast_to=httpx.Response,
                         options={"params": {"kind": "output"}})
    shown = partial.content.splitlines(keepends=True)
    headers = {k: v for k, v in partial.headers.items() if k.startswith("x-nightbatch")}
    print(f"\npartial read of {batch.id}: {headers}; {len(shown)} lines; first: {shown[0][:160]!r}")
    assert headers["x-nightbatch-complete"] == "false" and shown

    client.batches.cancel(batch.id)
    done = wait(client, batch.id)
    assert done.status == "cancelled"
    final = client.files.content(done.output_file_id or "").content.splitlines(keepends=True)
    assert set(shown) <= set(final), "a line shown while running is in the final file with the same bytes"

    retry = client.post(f"/nightbatch/batches/{batch.id}/retry", cast_to=Batch, body={},
                        options={"headers": {"Idempotency-Key": f"retry-{batch.id}"}})
    assert (retry.model_extra or {})["nightbatch"]["retry_of"] == batch.id
    assert retry.endpoint == done.endpoint and retry.completion_window == done.completion_window
    again = client.post(f"/nightbatch/batches/{batch.id}/retry", cast_to=Batch, body={},
                        options={"headers": {"Idempotency-Key": f"retry-{batch.id}"}})
    assert again.id == retry.id
    retried = wait(client, retry.id)
    old = client.batches.retrieve(batch.id)
    print(f"retry round trip: {batch.id} {old.status} {old.request_counts} nightbatch.retried_by="
          f"{(old.model_extra or {})['nightbatch']['retried_by']}; {retried.id} {retried.status} "
          f"{retried.request_counts} nightbatch.retry_of={(retried.model_extra or {})['nightbatch']['retry_of']} "
          f"retry_lines={(retried.model_extra or {})['nightbatch']['retry_lines']}")
    assert (old.model_extra or {})["nightbatch"]["retried_by"] == [retry.id]
    assert retried.status == "completed" and retried.request_counts is not None
    assert retried.request_counts.total == (old.request_counts.failed if old.request_counts else -1)
    union = [r["custom_id"] for r in lines_of(client, done.output_file_id) + lines_of(client, retried.output_file_id)]
    assert sorted(union) == sorted(f"chat-{i}" for i in range(n)), "every line exactly once across the two"
