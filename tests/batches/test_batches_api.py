"""Batches API through the stock OpenAI SDK over real HTTP: create, retrieve, list newest first, cancel."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import openai
import pytest
from openai import OpenAI

from nightbatch.batches import lifecycle

if TYPE_CHECKING:
    from tests.conftest import ApiServer

BATCH_FIELDS = {
    "id",
    "object",
    "endpoint",
    "model",
    "errors",
    "input_file_id",
    "completion_window",
    "status",
    "output_file_id",
    "error_file_id",
    "created_at",
    "in_progress_at",
    "expires_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
    "request_counts",
    "usage",
    "metadata",
}
UNSET_AT_CREATE = BATCH_FIELDS - {
    "id",
    "object",
    "endpoint",
    "input_file_id",
    "completion_window",
    "status",
    "created_at",
    "expires_at",
    "request_counts",
    "metadata",
}


@pytest.fixture
def input_file_id(openai_client: OpenAI, make_jsonl: Callable[..., bytes]) -> str:
    return openai_client.files.create(file=("in.jsonl", make_jsonl(2)), purpose="batch").id


def create(client: OpenAI, file_id: str, **kw: Any) -> Any:
    kw.setdefault("endpoint", "/v1/chat/completions")
    kw.setdefault("completion_window", "24h")
    return client.batches.create(input_file_id=file_id, **kw)


def test_create_returns_every_field(openai_client: OpenAI, api_server: ApiServer, input_file_id: str) -> None:
    resp = openai_client.batches.with_raw_response.create(
        input_file_id=input_file_id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"customer": "acme"},
    )
    raw = resp.http_response.json()
    assert set(raw) >= BATCH_FIELDS
    assert {k for k in UNSET_AT_CREATE if raw[k] is not None} == set()
    assert raw["object"] == "batch"
    assert raw["id"].startswith("batch_")
    assert raw["status"] == "validating"
    assert raw["endpoint"] == "/v1/chat/completions"
    assert raw["input_file_id"] == input_file_id
    assert raw["completion_window"] == "24h"
    assert raw["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
    assert raw["expires_at"] == raw["created_at"] + 24 * 3600
    assert raw["metadata"] == {"customer": "acme"}
    # Creating hands the batch to the workflow port.
    assert api_server.workflow.started == [raw["id"]]
    assert resp.parse().id == raw["id"]


@pytest.mark.parametrize(("window", "hours"), [("1h", 1), ("24h", 24), ("72h", 72), ("168h", 168)])
def test_expires_at_is_created_at_plus_the_window(
    openai_client: OpenAI, input_file_id: str, window: str, hours: int
) -> None:
    b = create(openai_client, input_file_id, completion_window=window)
    assert b.completion_window == window
    assert b.expires_at == b.created_at + hours * 3600


@pytest.mark.parametrize("endpoint", ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"])
def test_every_supported_endpoint(openai_client: OpenAI, input_file_id: str, endpoint: str) -> None:
    assert create(openai_client, input_file_id, endpoint=endpoint).endpoint == endpoint


def test_metadata_none_is_accepted(openai_client: OpenAI, api_server: ApiServer, input_file_id: str) -> None:
    b = create(openai_client, input_file_id, metadata=None)
    assert b.metadata is None
    # The SDK really sent JSON null (the case the contract calls out).
    create_call = [r for r in api_server.requests if r.method == "POST" and r.path == "/v1/batches"][-1]
    assert create_call.headers["content-type"] == "application/json"


def test_output_expires_after_is_accepted(openai_client: OpenAI, input_file_id: str) -> None:
    b = create(openai_client, input_file_id, output_expires_after={"anchor": "created_at", "seconds": 7200})
    assert b.status == "validating"


def test_retrieve(openai_client: OpenAI, input_file_id: str) -> None:
    b = create(openai_client, input_file_id, metadata={"k": "v"})
    assert openai_client.batches.retrieve(b.id) == b


def test_list_auto_pages_newest_first(
    openai_client: OpenAI, api_server: ApiServer, input_file_id: str
) -> None:
    created = [create(openai_client, input_file_id).id for _ in range(5)]
    # Newest first, same-second creations too (by the moment each was made), each batch once, over 3 pages of 2.
    items = list(openai_client.batches.list(limit=2))
    assert [b.id for b in items] == list(reversed(created))
    pages = [r for r in api_server.requests if r.method == "GET" and r.path == "/v1/batches"]
    assert len(pages) == 3
    first = openai_client.batches.with_raw_response.list(limit=2).http_response.json()
    assert first["has_more"] is True
    assert first["first_id"] == items[0].id
    assert first["last_id"] == items[1].id


def test_list_after_is_exclusive(openai_client: OpenAI, input_file_id: str) -> None:
    for _ in range(3):
        create(openai_client, input_file_id)
    everything = [b.id for b in openai_client.batches.list(limit=100).data]
    assert [b.id for b in openai_client.batches.list(after=everything[0]).data] == everything[1:]


def test_default_list_is_one_page_of_twenty(openai_client: OpenAI, input_file_id: str) -> None:
    page = openai_client.batches.list()
    assert page.data == []
    assert page.has_more is False


def test_cancel_returns_cancelling_then_is_idempotent(openai_client: OpenAI, input_file_id: str) -> None:
    b = create(openai_client, input_file_id)
    first = openai_client.batches.cancel(b.id)
    assert first.status == "cancelling"
    assert first.cancelling_at is not None and first.cancelling_at >= b.created_at
    second = openai_client.batches.cancel(b.id)
    assert second.status == "cancelling"
    assert second.cancelling_at == first.cancelling_at
    assert openai_client.batches.retrieve(b.id).status == "cancelling"


def test_cancel_in_progress(openai_client: OpenAI, api_server: ApiServer, input_file_id: str) -> None:
    b = create(openai_client, input_file_id)
    lifecycle.transition(api_server.services.adapters.table, b.id, "in_progress")
    assert openai_client.batches.cancel(b.id).status == "cancelling"


def test_cancel_of_a_cancelled_batch_returns_it(
    openai_client: OpenAI, api_server: ApiServer, input_file_id: str
) -> None:
    b = create(openai_client, input_file_id)
    openai_client.batches.cancel(b.id)
    lifecycle.transition(api_server.services.adapters.table, b.id, "cancelled")
    again = openai_client.batches.cancel(b.id)
    assert again.status == "cancelled"
    assert again.cancelled_at is not None


def _finish(api_server: ApiServer, batch_id: str, status: str) -> None:
    table = api_server.services.adapters.table
    if status == "failed":
        lifecycle.transition(table, batch_id, "failed")
        return
    lifecycle.transition(table, batch_id, "in_progress")
    lifecycle.transition(table, batch_id, "finalizing")
    if status != "finalizing":
        lifecycle.transition(table, batch_id, status)


@pytest.mark.parametrize("status", ["completed", "failed", "expired", "finalizing"])
def test_cancel_of_a_finished_batch_is_409_at_once(
    api_server: ApiServer, input_file_id: str, status: str
) -> None:
    # A client WITH the SDK's default retries: the server's x-should-retry: false must stop them.
    client = api_server.openai(max_retries=2)
    b = create(client, input_file_id)
    _finish(api_server, b.id, status)
    before = len(api_server.requests)

    with pytest.raises(openai.ConflictError) as exc:
        client.batches.cancel(b.id)

    cancels = [r for r in api_server.requests[before:] if r.path == f"/v1/batches/{b.id}/cancel"]
    assert len(cancels) == 1
    assert cancels[0].headers.get("x-stainless-retry-count") == "0"
    assert exc.value.status_code == 409
    assert exc.value.response.headers["x-should-retry"] == "false"
    assert exc.value.body == {
        "message": f"Cannot cancel a batch with status '{status}'.",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }
    assert client.batches.retrieve(b.id).status == status


def test_unknown_batch_is_404(openai_client: OpenAI) -> None:
    for call in (openai_client.batches.retrieve, openai_client.batches.cancel):
        with pytest.raises(openai.NotFoundError) as exc:
            call("batch_doesnotexist")
        assert "batch_doesnotexist" in exc.value.message


@pytest.mark.parametrize("bad", ["nope", "file-missing000000000000000"])
def test_create_with_an_unknown_input_file_is_400(openai_client: OpenAI, bad: str) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        create(openai_client, bad)
    assert exc.value.param == "input_file_id"


def test_create_with_a_non_batch_file_is_400(openai_client: OpenAI) -> None:
    f = openai_client.files.create(file=("x.jsonl", b"{}\n"), purpose="user_data")
    with pytest.raises(openai.BadRequestError) as exc:
        create(openai_client, f.id)
    assert exc.value.param == "input_file_id"
