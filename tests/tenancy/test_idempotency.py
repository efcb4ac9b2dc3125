"""Idempotency-Key on POST /v1/batches and /v1/files, through the OpenAI SDK over real HTTP."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import openai
import pytest
from starlette.requests import Request

from functions.api.idempotency import Idempotency
from nightbatch.clock import now
from nightbatch.errors import InvalidRequestError
from nightbatch.tenancy import idempotency
from nightbatch.tenancy.idempotency import Claim, Fingerprint, IdempotencyStore, Replay, record_pk
from nightbatch.tenancy.limits import release_queue_usage
from tests.support.tenant_stack import Stack, chat_lines

CHAT = "/v1/chat/completions"


def create(client: openai.OpenAI, file_id: str, key: str | None, **kw: Any) -> Any:
    headers = {"Idempotency-Key": key} if key else {}
    return client.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="24h",
                                 extra_headers=headers, **kw)


@pytest.fixture
def stack(make_stack: Any) -> Stack:
    s: Stack = make_stack()
    return s


def test_replay_returns_the_same_batch(stack: Stack) -> None:
    client = stack.client(stack.new_key("team-a"))
    f = client.files.create(file=("in.jsonl", chat_lines(2)), purpose="batch")
    first = create(client, f.id, "k-1", metadata={"run": "1"})
    raw = client.batches.with_raw_response.create(
        input_file_id=f.id, endpoint=CHAT, completion_window="24h", metadata={"run": "1"},
        extra_headers={"Idempotency-Key": "k-1"})
    again = raw.parse()
    assert again.id == first.id
    assert again.model_dump() == first.model_dump()
    assert raw.status_code == 200 and raw.headers["idempotent-replayed"] == "true"
    assert [b.id for b in client.batches.list()] == [first.id]
    assert stack.workflow.started == [first.id]  # one workflow start, not two


def test_a_changed_body_409s_at_once(stack: Stack) -> None:
    client = stack.client(stack.new_key("team-a"), max_retries=2)  # the SDK default: it would retry a 409
    f = client.files.create(file=("in.jsonl", chat_lines(2)), purpose="batch")
    first = create(client, f.id, "k-2", metadata={"run": "1"})
    before = stack.hits("POST", "/v1/batches")
    with pytest.raises(openai.ConflictError) as info:
        create(client, f.id, "k-2", metadata={"run": "2"})
    assert stack.hits("POST", "/v1/batches") == before + 1  # not retried: x-should-retry: false
    err = info.value
    assert err.response.headers["x-should-retry"] == "false"
    assert "already used with a different request" in err.message
    assert err.code == "idempotency_key_reused"
    assert [b.id for b in client.batches.list()] == [first.id]


def test_keys_are_per_tenant(stack: Stack) -> None:
    a = stack.client(stack.new_key("team-a"))
    b = stack.client(stack.new_key("team-b"))
    fa = a.files.create(file=("in.jsonl", chat_lines(1)), purpose="batch")
    fb = b.files.create(file=("in.jsonl", chat_lines(1)), purpose="batch")
    ba = create(a, fa.id, "shared-key")
    bb = create(b, fb.id, "shared-key")  # another tenant's key space: no conflict, no replay of A's batch
    assert ba.id != bb.id


def test_file_upload_replay_and_conflict(stack: Stack) -> None:
    client = stack.client(stack.new_key("team-a"))
    content = chat_lines(50)
    h = {"Idempotency-Key": "upload-1"}
    f1 = client.files.create(file=("in.jsonl", content), purpose="batch", extra_headers=h)
    # A retry re-encodes the multipart body with a new boundary: still the same request.
    f2 = client.files.create(file=("in.jsonl", content), purpose="batch", extra_headers=h)
    assert f1.id == f2.id
    assert [x.id for x in client.files.list()] == [f1.id]
    for changed in ({"file": ("in.jsonl", content + b"\n")}, {"file": ("other.jsonl", content)}):
        with pytest.raises(openai.ConflictError):
            client.files.create(purpose="batch", extra_headers=h, **changed)  # type: ignore[arg-type]
    with pytest.raises(openai.ConflictError):
        client.files.create(file=("in.jsonl", content), purpose="user_data", extra_headers=h)
    # The same key on another path is a different request too.
    with pytest.raises(openai.ConflictError):
        create(client, f1.id, "upload-1")


def test_duplicate_while_the_first_is_processing_409s_retryable(stack: Stack) -> None:
    client = stack.client(stack.new_key("team-a"))
    f = client.files.create(file=("in.jsonl", chat_lines(1)), purpose="batch")
    body = httpx.Request("POST", "http://x/v1/batches", json={
        "input_file_id": f.id, "endpoint": CHAT, "completion_window": "24h"}).content
    # The first request has claimed the key and is still running (claimed exactly as the route claims it).
    fp = Fingerprint("POST", "/v1/batches")
    fp.update(b"body", body)
    store = IdempotencyStore(stack.table, ttl_seconds=86400, lock_seconds=300)
    tenant = "team-a"
    claim = store.begin(tenant, "busy", fp.hexdigest())
    assert isinstance(claim, Claim)
    headers = {"Authorization": f"Bearer {client.api_key}", "Idempotency-Key": "busy",
               "Content-Type": "application/json"}
    r = httpx.post(f"{stack.base_url}/batches", content=body, headers=headers)
    assert r.status_code == 409
    assert r.headers["x-should-retry"] == "true" and r.headers["retry-after"] == "1"
    assert "still being processed" in r.json()["error"]["message"]
    # Once the first finishes, the retry gets its answer.
    store.complete(claim, 200, {"id": "batch_from_the_first_request", "object": "batch"})
    r = httpx.post(f"{stack.base_url}/batches", content=body, headers=headers)
    assert r.status_code == 200 and r.json()["id"] == "batch_from_the_first_request"


def test_concurrent_duplicates_create_one_batch(stack: Stack) -> None:
    key = stack.new_key("team-a")
    f = stack.client(key).files.create(file=("in.jsonl", chat_lines(1)), purpose="batch")
    results: list[Any] = []
    barrier = threading.Barrier(6)

    def send() -> None:
        client = stack.client(key, max_retries=5)  # the SDK retries the retryable 409s
        barrier.wait()
        try:
            results.append(create(client, f.id, "race").id)
        except Exception as e:  # collected, asserted below
            results.append(e)

    threads = [threading.Thread(target=send) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(isinstance(r, str) for r in results), results
    assert len(set(results)) == 1
    assert len(stack.client(key).batches.list().data) == 1


def test_a_deterministic_error_is_replayed_and_a_429_is_not(make_stack: Any) -> None:
    stack = make_stack(limit_batches_in_flight=1)
    client = stack.client(stack.new_key("team-a"))
    f = client.files.create(file=("in.jsonl", chat_lines(1)), purpose="batch")
    with pytest.raises(openai.BadRequestError):
        create(client, "file-doesnotexist", "bad")
    raw = client.batches.with_raw_response
    with pytest.raises(openai.BadRequestError) as info:
        raw.create(input_file_id="file-doesnotexist", endpoint=CHAT, completion_window="24h",
                   extra_headers={"Idempotency-Key": "bad"})
    assert info.value.response.headers["idempotent-replayed"] == "true"

    first = create(client, f.id, "one")
    with pytest.raises(openai.RateLimitError):
        create(client, f.id, "two")
    release_queue_usage(stack.table, "team-a", first.id)  # what the terminal transition does
    second = create(client, f.id, "two")  # the 429 did not stick to the key
    assert second.id != first.id


def test_expired_records_and_stale_locks_are_taken_over(make_stack: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the store's own clock (a fixed time, then 2 s later): a slow machine cannot let the lock lapse early."""
    stack = make_stack()
    store = IdempotencyStore(stack.table, ttl_seconds=1, lock_seconds=1)
    start = now()
    monkeypatch.setattr(idempotency, "now", lambda: start)
    claim = store.begin("t", "k", "fp-1")
    assert isinstance(claim, Claim)
    with pytest.raises(InvalidRequestError) as info:
        store.begin("t", "k", "fp-1")
    assert info.value.headers["x-should-retry"] == "true"
    monkeypatch.setattr(idempotency, "now", lambda: start + 2)
    late = store.begin("t", "k", "fp-2")  # expired: a new request may use the key
    assert isinstance(late, Claim)
    store.complete(claim, 200, {"stale": True})  # the old owner cannot overwrite the new record
    store.complete(late, 200, {"fresh": True})
    assert stack.table.get(record_pk("t", "k"))["body"] == '{"fresh": true}'


def test_run_abandons_on_unexpected_errors(make_stack: Any) -> None:
    stack = make_stack()
    store = IdempotencyStore(stack.table, ttl_seconds=60, lock_seconds=60)
    idem = Idempotency(request=Request({"type": "http", "path": "/v1/batches", "headers": []}), store=store,
                       tenant="t", key="k", fingerprint="fp")

    def boom() -> Any:
        raise RuntimeError("storage down")

    with pytest.raises(RuntimeError):
        idem.run(boom)
    assert stack.table.get(record_pk("t", "k"))["state"] == "abandoned"
    response = idem.run(lambda: {"ok": 1})  # the retry runs the request again
    assert response.status_code == 200
    replay = store.begin("t", "k", "fp")
    assert isinstance(replay, Replay) and replay.body == {"ok": 1}


def test_invalid_keys_are_400(stack: Stack) -> None:
    client = stack.client(stack.new_key("team-a"))
    client.files.list(extra_headers={"Idempotency-Key": "k" * 300})  # not looked at on GET
    with pytest.raises(openai.BadRequestError) as info:
        create(client, "file-x", "k" * 300)
    assert info.value.param == "Idempotency-Key"
