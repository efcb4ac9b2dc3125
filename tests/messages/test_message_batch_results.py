"""A Message Batch's results as a File's content is served (nightbatch/messages/results.py): Anthropic's lines
written once by Finalize into an object of their own, streamed inline up to `max_inline_download_bytes` and past it
a 307 to a pre-signed URL of moto's S3 server, which the real `anthropic` SDK follows. Validate, Plan, the shard
runner (deterministic engine) and Finalize run for real on moto; the API over real HTTP."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import anthropic
import pytest

from nightbatch import layout
from nightbatch.messages.objects import batch_id_of
from nightbatch.pipeline import BatchTaskInput, finalize_batch, validate_batch
from nightbatch.wiring import Services
from tests.support.pipeline_world import run_shards

if TYPE_CHECKING:
    from tests.conftest import ApiServer

MODEL = "SmolLM2-135M-Instruct"
LIMIT = 4096


def ask(i: int, text: str | None = None) -> dict[str, Any]:
    return {"custom_id": f"r-{i}", "params": {"model": MODEL, "max_tokens": 8,
                                               "messages": [{"role": "user", "content": text or f"Say {i}"}]}}


@pytest.fixture
def api(serve_api: Callable[..., ApiServer]) -> ApiServer:
    return serve_api(max_inline_download_bytes=LIMIT, presigned_url_seconds=60)


Seen = list[tuple[str, dict[str, str]]]


@pytest.fixture
def seen() -> Seen:
    return []


@pytest.fixture
def claude(api: ApiServer, seen: Seen) -> Iterator[anthropic.Anthropic]:
    client = make_client(api, seen, api_key=api.api_key)
    yield client
    client.close()


def make_client(api: ApiServer, seen: Seen, **auth: str) -> anthropic.Anthropic:
    def record(request: Any) -> None:
        seen.append((str(request.url), {k.lower(): v for k, v in request.headers.items()}))

    return anthropic.Anthropic(base_url=api.base_url, max_retries=0, **auth,
                               http_client=anthropic.DefaultHttpxClient(event_hooks={"request": [record]}))


def run_to_end(services: Services, message_batch_id: str) -> str:
    """Validate → Plan → every shard on the deterministic engine → Finalize, as the workflow does."""
    batch_id = batch_id_of(message_batch_id)
    assert batch_id is not None
    inp = BatchTaskInput(batch_id=batch_id)
    if validate_batch(inp, services).valid:
        run_shards(services, batch_id, MODEL)
        finalize_batch(inp, services)
    return batch_id


def results(client: anthropic.Anthropic, message_batch_id: str) -> dict[str, dict[str, Any]]:
    rows = [r.model_dump(mode="json", exclude_unset=True) for r in client.messages.batches.results(message_batch_id)]
    assert len(rows) == len({r["custom_id"] for r in rows})
    return {r["custom_id"]: r["result"] for r in rows}


def stored(api: ApiServer, batch_id: str) -> bytes | None:
    return api.services.adapters.blobs.get_bytes(layout.message_results_key(batch_id))


def s3_requests(api: ApiServer, seen: Seen) -> list[tuple[str, dict[str, str]]]:
    endpoint = api.services.adapters.endpoint_url or ""
    return [(url, headers) for url, headers in seen if endpoint and url.startswith(endpoint)]


def test_results_past_the_inline_limit_come_from_s3_through_a_redirect_the_sdk_follows(
        api: ApiServer, claude: anthropic.Anthropic, seen: Seen) -> None:
    requests = [ask(i) for i in range(40)] + [ask(40, "please FAIL")]
    mb = claude.messages.batches.create(requests=requests)  # type: ignore[arg-type]
    batch_id = run_to_end(api.services, mb.id)
    data = stored(api, batch_id)
    assert data is not None and len(data) > LIMIT  # written by Finalize, before the batch ended
    assert claude.messages.batches.retrieve(mb.id).request_counts.succeeded == 40

    seen.clear()
    got = results(claude, mb.id)
    assert set(got) == {f"r-{i}" for i in range(41)}
    assert {got[f"r-{i}"]["type"] for i in range(40)} == {"succeeded"}
    message = got["r-3"]["message"]
    assert message["type"] == "message" and message["content"][0]["text"] and message["usage"]["output_tokens"] > 0
    assert got["r-40"] == {"type": "errored", "error": {"type": "error", "error": {
        "type": "invalid_request_error", "message": "The test engine rejected this request."}}}
    assert {json.loads(line)["custom_id"]: json.loads(line)["result"] for line in data.splitlines()} == got
    # Retrieve, then the results path (a 307), then S3 with a pre-signed URL.
    (url, headers), = s3_requests(api, seen)
    assert "X-Amz-Signature=" in url and "X-Amz-Expires=60" in url
    assert seen[-2][0] == f"{api.v1}/messages/batches/{mb.id}/results"
    # The SDK sends its key as Authorization: Bearer, which its HTTP client drops on a redirect to another origin.
    assert seen[-2][1]["authorization"] == f"Bearer {api.api_key}" and api.api_key not in json.dumps(headers)

    # Under the limit: inline, from the same object, in one request.
    api.settings.files.max_inline_download_bytes = len(data)
    seen.clear()
    assert results(claude, mb.id) == got
    assert s3_requests(api, seen) == [] and len(seen) == 2


def test_a_batch_ended_without_the_object_gets_it_on_its_first_request(
        api: ApiServer, claude: anthropic.Anthropic, seen: Seen) -> None:
    """Finalized by 0.1.x (no object): the first results request writes the object, then serves it
    as any other."""
    mb = claude.messages.batches.create(requests=[ask(i) for i in range(40)])  # type: ignore[arg-type]
    batch_id = run_to_end(api.services, mb.id)
    first = stored(api, batch_id)
    got = results(claude, mb.id)
    api.services.adapters.blobs.delete(layout.message_results_key(batch_id))  # as 0.1.x left it
    seen.clear()
    assert results(claude, mb.id) == got and len(s3_requests(api, seen)) == 1
    assert stored(api, batch_id) == first


def test_a_batch_refused_as_a_whole_has_its_lines_written_by_the_first_request(
        api: ApiServer, claude: anthropic.Anthropic, seen: Seen) -> None:
    mb = claude.messages.batches.create(requests=[ask(i) for i in range(60)])  # type: ignore[arg-type]
    batch_id = batch_id_of(mb.id)
    assert batch_id is not None
    api.settings.validation.max_input_bytes = 100  # Validate refuses the whole input, line by line results
    run_to_end(api.services, mb.id)
    assert claude.messages.batches.retrieve(mb.id).processing_status == "ended"
    assert stored(api, batch_id) is None  # refused at Validate: Finalize did not run
    seen.clear()
    got = results(claude, mb.id)
    assert set(got) == {f"r-{i}" for i in range(60)} and {r["type"] for r in got.values()} == {"errored"}
    assert "over the limit" in got["r-0"]["error"]["error"]["message"]
    assert len(s3_requests(api, seen)) == 1
    data = stored(api, batch_id)
    assert data is not None and len(data) > LIMIT


def test_once_a_result_file_is_gone_the_object_is_not_served(api: ApiServer, claude: anthropic.Anthropic) -> None:
    """The object says what the files said: once one has expired or been deleted, the lines of what is left."""
    requests = [ask(i) for i in range(20)] + [ask(20, "FAIL")]
    mb = claude.messages.batches.create(requests=requests)  # type: ignore[arg-type]
    batch_id = run_to_end(api.services, mb.id)
    rec = api.services.batches.item("default", batch_id)
    assert rec.output_file_id and rec.error_file_id
    assert len(results(claude, mb.id)) == 21
    api.services.files.delete("default", rec.output_file_id)
    assert list(results(claude, mb.id)) == ["r-20"]


def test_delete_removes_the_object(api: ApiServer, claude: anthropic.Anthropic) -> None:
    mb = claude.messages.batches.create(requests=[ask(0)])  # type: ignore[arg-type]
    batch_id = run_to_end(api.services, mb.id)
    assert stored(api, batch_id) is not None
    claude.messages.batches.delete(mb.id)
    assert stored(api, batch_id) is None
