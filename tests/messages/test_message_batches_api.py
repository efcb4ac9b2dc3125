"""Anthropic's Message Batches API through the real `anthropic` SDK over HTTP (the workflow records, runs nothing):
object shapes, validation at create in Anthropic's error envelope, keys, pagination, cancel, delete, and each
wire answering the other's batches as unknown."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import anthropic
import httpx
import openai
import pytest

from nightbatch.batches import lifecycle
from nightbatch.messages.objects import batch_id_of

if TYPE_CHECKING:
    from tests.conftest import ApiServer

MODEL = "SmolLM2-135M-Instruct"


def params(i: int = 0, **over: Any) -> dict[str, Any]:
    p: dict[str, Any] = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": f"Say {i}"}]}
    p.update(over)
    return {k: v for k, v in p.items() if v is not ...}


def reqs(n: int, **over: Any) -> list[Any]:
    return [{"custom_id": f"r-{i}", "params": params(i, **over)} for i in range(n)]


@pytest.fixture
def claude(api_server: ApiServer) -> Iterator[anthropic.Anthropic]:
    client = anthropic.Anthropic(base_url=api_server.base_url, api_key=api_server.api_key, max_retries=0)
    yield client
    client.close()


def refusal(call: Callable[[], Any]) -> tuple[int, dict[str, Any]]:
    with pytest.raises(anthropic.APIStatusError) as info:
        call()
    return info.value.status_code, info.value.response.json()


def assert_envelope(body: dict[str, Any], type_: str, message: str | None = None) -> None:
    assert set(body) == {"type", "error", "request_id"} and body["type"] == "error"
    assert body["request_id"].startswith("req_") and set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == type_
    if message is not None:
        assert body["error"]["message"] == message


def test_create_and_retrieve_show_anthropic_shapes(api_server: ApiServer, claude: anthropic.Anthropic) -> None:
    mb = claude.messages.batches.create(requests=reqs(3))  # type: ignore[arg-type]
    assert mb.id.startswith("msgbatch_") and mb.type == "message_batch" and mb.processing_status == "in_progress"
    assert mb.request_counts.model_dump() == {"processing": 3, "succeeded": 0, "errored": 0, "canceled": 0,
                                              "expired": 0}
    assert mb.ended_at is None and mb.cancel_initiated_at is None and mb.results_url is None
    assert (mb.expires_at - mb.created_at).total_seconds() == 24 * 3600
    assert claude.messages.batches.retrieve(mb.id) == mb
    raw = httpx.get(f"{api_server.v1}/messages/batches/{mb.id}", headers={
        "x-api-key": api_server.api_key, "anthropic-version": "2023-06-01"}).json()
    assert set(raw) == {"id", "type", "processing_status", "request_counts", "ended_at", "created_at", "expires_at",
                        "cancel_initiated_at", "archived_at", "results_url"}
    assert raw["created_at"].endswith("Z")
    assert api_server.workflow.started == [batch_id_of(mb.id)]


@pytest.mark.parametrize(("requests", "message"), [
    (reqs(1, max_tokens=...), "requests.0.params.max_tokens: Field required"),
    ([{"custom_id": "bad id!", "params": params()}], "requests.0.custom_id: String should match pattern "
                                                    "'^[a-zA-Z0-9_-]{1,64}$'"),
    # `$` alone would take a trailing newline: the whole custom_id must match.
    ([{"custom_id": "abc\n", "params": params()}], "requests.0.custom_id: String should match pattern "
                                                  "'^[a-zA-Z0-9_-]{1,64}$'"),
    ([{"custom_id": "x", "params": params()}, {"custom_id": "x", "params": params()}], None),
    (reqs(1, model="no-such-model"), None),
    (reqs(1, messages=[{"role": "system", "content": "x"}]), "requests.0.params.messages.0.role: Input should be "
                                                            "'user' or 'assistant'"),
    (reqs(1, stream=True), None),
    ([{"custom_id": "x"}], "requests.0.params: Field required"),
    ([], "requests: List should have at least 1 item"),
])
def test_malformed_requests_are_refused_with_anthropics_envelope(
        api_server: ApiServer, claude: anthropic.Anthropic, requests: list[Any], message: str | None) -> None:
    status, body = refusal(lambda: claude.messages.batches.create(requests=requests))
    assert status == 400
    assert_envelope(body, "invalid_request_error", message)
    assert body["error"]["message"].startswith("requests")
    assert api_server.workflow.started == []
    assert list(claude.messages.batches.list()) == []


# What the standard library's JSON parser (FastAPI's, for request bodies) takes but no line can carry, as the raw
# JSON text of a request's params: a lone surrogate escape, NaN, and a number beyond a double (parsed as infinity).
UNCARRIABLE = [
    pytest.param('"max_tokens": 8, "messages": [{"role": "user", "content": "a\\ud800b"}]', "surrogate",
                 id="lone-surrogate"),
    pytest.param('"max_tokens": 8, "temperature": NaN, "messages": [{"role": "user", "content": "hi"}]', "NaN",
                 id="nan"),
    pytest.param('"max_tokens": 8, "top_p": 1e400, "messages": [{"role": "user", "content": "hi"}]', "Infinity",
                 id="1e400"),
]


@pytest.mark.parametrize(("fields", "named"), UNCARRIABLE)
def test_a_request_holding_what_no_line_can_carry_is_refused_by_its_index(
        api_server: ApiServer, claude: anthropic.Anthropic, fields: str, named: str) -> None:
    """A clean 400 in Anthropic's envelope naming the request, not a 500 nor a batch of altered requests (the
    line encoder writes NaN and infinities as null)."""
    good = json.dumps({"custom_id": "ok", "params": params(0)})
    bad = f'{{"custom_id": "bad", "params": {{"model": "{MODEL}", {fields}}}}}'
    r = httpx.post(f"{api_server.v1}/messages/batches", content=f'{{"requests": [{good}, {bad}]}}'.encode(),
                   headers={"x-api-key": api_server.api_key, "anthropic-version": "2023-06-01",
                            "content-type": "application/json"})
    assert r.status_code == 400, r.text
    body = r.json()
    assert_envelope(body, "invalid_request_error")
    assert body["error"]["message"].startswith("requests.1.params: ") and named in body["error"]["message"]
    assert api_server.workflow.started == []
    assert list(claude.messages.batches.list()) == []


def test_keys_and_version_header(api_server: ApiServer, claude: anthropic.Anthropic) -> None:
    bad = anthropic.Anthropic(base_url=api_server.base_url, api_key="wrong", max_retries=0)
    status, body = refusal(lambda: bad.messages.batches.list())
    assert status == 401
    assert_envelope(body, "authentication_error")
    url = f"{api_server.v1}/messages/batches"
    # Bearer is accepted as on every other path; a missing anthropic-version is refused as Anthropic refuses it.
    ok = httpx.get(url, headers={**api_server.auth, "anthropic-version": "2023-06-01"})
    assert ok.status_code == 200 and ok.json() == {"data": [], "has_more": False, "first_id": None, "last_id": None}
    no_version = httpx.get(url, headers=api_server.auth)
    assert no_version.status_code == 400
    assert_envelope(no_version.json(), "invalid_request_error", "anthropic-version: header is required")
    assert ok.headers["request-id"].startswith("req_")


def test_each_wire_answers_the_others_batches_as_unknown(api_server: ApiServer, claude: anthropic.Anthropic,
                                                        make_jsonl: Callable[..., bytes]) -> None:
    oa = api_server.openai()
    f = oa.files.create(file=("in.jsonl", make_jsonl(1)), purpose="batch")
    ob = oa.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    mb = claude.messages.batches.create(requests=reqs(1))  # type: ignore[arg-type]
    inner = batch_id_of(mb.id)
    assert inner is not None
    with pytest.raises(openai.NotFoundError):
        oa.batches.retrieve(inner)
    with pytest.raises(openai.NotFoundError):
        oa.batches.cancel(inner)
    assert [b.id for b in oa.batches.list()] == [ob.id]
    twin = "msgbatch_" + ob.id.removeprefix("batch_")
    for call in (lambda: claude.messages.batches.retrieve(twin), lambda: claude.messages.batches.cancel(twin),
                 lambda: claude.messages.batches.retrieve("batch_x")):
        status, body = refusal(call)
        assert status == 404
        assert_envelope(body, "not_found_error")
    assert [b.id for b in claude.messages.batches.list()] == [mb.id]
    # OpenAI's create does not take the Anthropic wire's endpoint.
    with pytest.raises(openai.BadRequestError):
        oa.batches.create(input_file_id=f.id, endpoint="/v1/messages", completion_window="24h")  # type: ignore[arg-type]


def test_list_pages_newest_first_both_ways(claude: anthropic.Anthropic) -> None:
    made = [claude.messages.batches.create(requests=reqs(1)).id for _ in range(5)]  # type: ignore[arg-type]
    newest_first = made[::-1]
    page = claude.messages.batches.list(limit=2)
    assert [b.id for b in page.data] == newest_first[:2] and page.has_more
    assert (page.first_id, page.last_id) == (newest_first[0], newest_first[1])
    assert [b.id for b in claude.messages.batches.list(limit=2)] == newest_first  # auto-paging on after_id
    back = claude.messages.batches.list(limit=2, before_id=newest_first[3])
    assert [b.id for b in back.data] == newest_first[1:3] and back.has_more
    assert [b.id for b in claude.messages.batches.list(after_id=newest_first[3]).data] == newest_first[4:]
    status, body = refusal(lambda: claude.messages.batches.list(limit=0))
    assert status == 400
    assert_envelope(body, "invalid_request_error")


def test_cancel_delete_and_results(api_server: ApiServer, claude: anthropic.Anthropic) -> None:
    mb = claude.messages.batches.create(requests=reqs(2))  # type: ignore[arg-type]
    status, body = refusal(lambda: claude.messages.batches.delete(mb.id))
    assert status == 400 and "still processing" in body["error"]["message"]
    early = httpx.get(f"{api_server.v1}/messages/batches/{mb.id}/results",
                      headers={"x-api-key": api_server.api_key, "anthropic-version": "2023-06-01"})
    assert early.status_code == 400
    assert_envelope(early.json(), "invalid_request_error")
    canceling = claude.messages.batches.cancel(mb.id)
    assert canceling.processing_status == "canceling" and canceling.cancel_initiated_at is not None
    inner = batch_id_of(mb.id)
    assert inner is not None
    lifecycle.transition(api_server.services.adapters.table, inner, "cancelled", from_=("cancelling",),
                         extra={"request_counts": {"total": 2, "completed": 0, "failed": 2},
                                "unrun_counts": {"batch_cancelled": 2}})
    ended = claude.messages.batches.cancel(mb.id)  # cancelling an ended batch changes nothing
    assert ended.processing_status == "ended" and ended.request_counts.canceled == 2 and ended.ended_at
    assert list(claude.messages.batches.results(mb.id)) == []  # Finalize did not run: no files
    deleted = claude.messages.batches.delete(mb.id)
    assert (deleted.id, deleted.type) == (mb.id, "message_batch_deleted")
    status, body = refusal(lambda: claude.messages.batches.retrieve(mb.id))
    assert status == 404
    assert list(claude.messages.batches.list()) == []
    rec = api_server.services.adapters.table.get_record(lifecycle.BatchRecord, inner)
    assert rec is not None and rec.deleted_at is not None  # kept for usage and cost


def test_inline_requests_are_bounded_by_the_upload_limit(serve_api: Callable[..., ApiServer]) -> None:
    api = serve_api(max_upload_bytes=2000)
    claude = anthropic.Anthropic(base_url=api.base_url, api_key=api.api_key, max_retries=0)
    status, body = refusal(lambda: claude.messages.batches.create(requests=reqs(40)))  # type: ignore[arg-type]
    assert status == 413
    assert_envelope(body, "request_too_large")
    assert claude.messages.batches.create(requests=reqs(2)).request_counts.processing == 2  # type: ignore[arg-type]


def test_an_idempotent_replay_of_a_refusal_keeps_anthropics_envelope(claude: anthropic.Anthropic) -> None:
    """The same Idempotency-Key and request: the stored 400 comes back (`idempotent-replayed`) in the envelope of
    the wire it is replayed on, with this response's own request id; the OpenAI wire's replay keeps OpenAI's."""
    bad = [{"custom_id": "bad id!", "params": params()}]
    key = {"Idempotency-Key": "mb-refused-1"}
    answers = []
    for _ in range(2):
        with pytest.raises(anthropic.BadRequestError) as info:
            claude.messages.batches.create(requests=bad, extra_headers=key)  # type: ignore[arg-type]
        answers.append(info.value.response)
    first, replay = answers
    assert "idempotent-replayed" not in first.headers and replay.headers["idempotent-replayed"] == "true"
    for r in answers:
        assert_envelope(r.json(), "invalid_request_error", "requests.0.custom_id: String should match pattern "
                                                           "'^[a-zA-Z0-9_-]{1,64}$'")
        assert r.json()["request_id"] == r.headers["request-id"]
    assert replay.json()["request_id"] != first.json()["request_id"]


def test_an_idempotent_replay_on_the_openai_wire_keeps_openais_envelope(api_server: ApiServer) -> None:
    oa = api_server.openai()
    for n in range(2):
        with pytest.raises(openai.BadRequestError) as info:
            oa.batches.create(input_file_id="file-missing", endpoint="/v1/chat/completions", completion_window="24h",
                              extra_headers={"Idempotency-Key": "oa-refused-1"})
        body = info.value.response.json()
        assert body == {"error": {"message": "Invalid 'input_file_id': 'file-missing'. The file does not exist or was "
                                          "not uploaded with purpose 'batch'.", "type": "invalid_request_error",
                                  "param": "input_file_id", "code": body["error"]["code"]}}
        assert (info.value.response.headers.get("idempotent-replayed") == "true") == (n == 1)
