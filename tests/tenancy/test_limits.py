"""Per-tenant limits: queued requests/tokens fail a batch in Validate; in-flight batches and request rate 429."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import openai
import pytest

from nightbatch.batches import lifecycle
from nightbatch.settings import Settings
from nightbatch.tenancy.limits import check_queue_limits, limits_for, read_usage, release_queue_usage
from tests.support.tenant_stack import MODEL, chat_lines, wait_for

CHAT = "/v1/chat/completions"


def new_batch(client: openai.OpenAI, lines: int = 1) -> Any:
    f = client.files.create(file=("in.jsonl", chat_lines(lines)), purpose="batch")
    return client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")


def test_limits_come_from_settings_with_per_tenant_overrides() -> None:
    s = Settings(limits={"queued_tokens": 1000, "tenant_limits_json": json.dumps({
        "big": {"queued_tokens": 10**9}, "*": {"requests_per_minute": 5}})})
    assert limits_for(s, "big").queued_tokens == 10**9
    assert limits_for(s, "big").requests_per_minute == s.limits.requests_per_minute
    assert limits_for(s, "small").queued_tokens == 1000
    assert limits_for(s, "small").requests_per_minute == 5
    with pytest.raises(ValueError):
        limits_for(Settings(limits={"tenant_limits_json": '{"x": {"queued_tokenz": 1}}'}), "x")


def test_queue_limits_reserve_once_per_batch_and_release(make_stack: Any) -> None:
    stack = make_stack(limit_queued_tokens=1000, limit_queued_requests=10)
    table, settings = stack.table, stack.settings
    assert check_queue_limits(table, "t", "batch_1", 4, 600, settings=settings) is None
    assert check_queue_limits(table, "t", "batch_1", 4, 600, settings=settings) is None  # a re-run Validate
    assert read_usage(table, "t").queued_tokens == 600
    err = check_queue_limits(table, "t", "batch_2", 1, 500, model=MODEL, settings=settings)
    assert err is not None and err.code == "token_limit_exceeded"
    assert err.message.startswith(f"Enqueued token limit reached for {MODEL} in tenant 't'. Limit: 1,000 "
                                  "enqueued tokens.")
    assert "600" in err.message and "500" in err.message
    err = check_queue_limits(table, "t", "batch_3", 7, 10, settings=settings)
    assert err is not None and "Limit: 10 enqueued requests" in err.message
    assert check_queue_limits(table, "other", "batch_4", 4, 600, settings=settings) is None  # per tenant
    release_queue_usage(table, "t", "batch_1")
    release_queue_usage(table, "t", "batch_1")  # idempotent
    usage = read_usage(table, "t")
    assert (usage.queued_tokens, usage.queued_requests) == (0, 0)
    assert check_queue_limits(table, "t", "batch_2", 1, 500, settings=settings) is None


def test_an_over_limit_batch_fails_in_validate_with_the_numbers(make_stack: Any) -> None:
    stack = make_stack(workflow="local", limit_queued_requests=5)
    client = stack.client(stack.new_key("team-a"))
    small = new_batch(client, 3)
    done = wait_for(lambda: (b := client.batches.retrieve(small.id)).status in ("completed", "failed") and b)
    assert done.status == "completed"
    # Finished: its requests are no longer queued (given back just after the terminal write).
    wait_for(lambda: read_usage(stack.table, "team-a").queued_requests == 0)
    big = new_batch(client, 6)
    failed = wait_for(lambda: (b := client.batches.retrieve(big.id)).status in ("completed", "failed") and b)
    assert failed.status == "failed"
    [error] = failed.errors.data
    assert error.code == "token_limit_exceeded"
    assert "Limit: 5 enqueued requests" in error.message and "this batch has 6" in error.message
    wait_for(lambda: read_usage(stack.table, "team-a").batches_in_flight == 0)


def test_batches_in_flight_429_with_retry_after(make_stack: Any) -> None:
    stack = make_stack(limit_batches_in_flight=2, limit_in_flight_retry_after=7)
    a = stack.client(stack.new_key("team-a"))
    b = stack.client(stack.new_key("team-b"))
    first, _ = new_batch(a), new_batch(a)
    f = a.files.create(file=("in.jsonl", chat_lines(1)), purpose="batch")
    with pytest.raises(openai.RateLimitError) as info:
        a.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")
    err = info.value
    assert err.code == "rate_limit_exceeded"
    assert err.response.headers["retry-after"] == "7"
    assert "Too many batches in flight" in err.message and "limit 2" in err.message
    assert len(a.batches.list().data) == 2
    new_batch(b)  # another tenant is not affected
    # A batch that reaches a terminal status frees its slot.
    lifecycle.transition(stack.table, first.id, "failed")
    third = a.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")
    assert third.status == "validating"


def test_a_missed_release_is_reconciled(make_stack: Any) -> None:
    stack = make_stack(limit_batches_in_flight=1)
    a = stack.client(stack.new_key("team-a"))
    first = new_batch(a)
    # Terminal without the release (as if a process died between the two writes).
    stack.table.update(first.id, set_={"status": "failed"})
    assert read_usage(stack.table, "team-a").batches_in_flight == 1
    second = new_batch(a)
    assert second.id != first.id
    assert read_usage(stack.table, "team-a").batches_in_flight == 1


def test_request_rate_429_with_retry_after_and_per_tenant(make_stack: Any) -> None:
    stack = make_stack(tenant_limits_json=json.dumps({"team-a": {"requests_per_minute": 5}}))
    # Start early in a minute window so the five requests share it.
    if time.time() % 60 > 55:
        time.sleep(60 - time.time() % 60 + 0.1)
    a = stack.client(stack.new_key("team-a"))
    b = stack.client(stack.new_key("team-b"))
    for _ in range(5):
        a.files.list()
    with pytest.raises(openai.RateLimitError) as info:
        a.files.list()
    retry_after = int(info.value.response.headers["retry-after"])
    assert 1 <= retry_after <= 60
    assert info.value.code == "rate_limit_exceeded"
    assert "Limit 5 / min" in info.value.message
    for _ in range(10):
        b.files.list()  # another tenant is not starved


def test_the_sdk_honours_retry_after(make_stack: Any) -> None:
    stack = make_stack(limit_batches_in_flight=1, limit_in_flight_retry_after=1)
    client = stack.client(stack.new_key("team-a"), max_retries=2)
    new_batch(client)
    f = client.files.create(file=("in.jsonl", chat_lines(1)), purpose="batch")
    started = time.monotonic()
    with pytest.raises(openai.RateLimitError):
        client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")
    assert time.monotonic() - started >= 2 * 0.9  # two waits of Retry-After: 1 (not the 0.5 s backoff)
    assert stack.hits("POST", "/v1/batches") == 1 + 3


def test_limits_endpoint_shows_limits_and_use(make_stack: Any) -> None:
    stack = make_stack(limit_queued_tokens=1234, tenant_limits_json=json.dumps({"team-b": {
        "batches_in_flight": 3}}))
    key_a = stack.new_key("team-a")
    a = stack.client(key_a)
    new_batch(a)
    check_queue_limits(stack.table, "team-a", "batch_x", 3, 100, settings=stack.settings)
    r = httpx.get(f"{stack.base_url}/nightbatch/limits", headers={"Authorization": f"Bearer {key_a}"})
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "nightbatch.limits" and body["tenant"] == "team-a"
    assert body["limits"]["queued_tokens"] == 1234
    assert body["limits"]["batches_in_flight"] == stack.settings.limits.batches_in_flight
    assert body["usage"]["batches_in_flight"] == 1
    assert body["usage"]["queued_requests"] == 3 and body["usage"]["queued_tokens"] == 100
    assert body["usage"]["requests_this_minute"] >= 1
    b = stack.client(stack.new_key("team-b")).get("/nightbatch/limits", cast_to=httpx.Response)
    assert b.json()["limits"]["batches_in_flight"] == 3 and b.json()["usage"]["batches_in_flight"] == 0
