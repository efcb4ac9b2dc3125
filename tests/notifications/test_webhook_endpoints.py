"""Webhook endpoints through the real OpenAI SDK: create, retrieve, list, update, rotate, delete, test."""

from __future__ import annotations

import base64
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import openai
import pytest
from openai.types.webhooks import BatchCompletedWebhookEvent, BatchFailedWebhookEvent

from nightbatch.notifications.objects import CreateWebhookEndpointRequest
from tests.notifications.support import deliveries, event_json


class Tarpit:
    """A receiver that takes the request, then answers only once the test sets `release`."""

    def __init__(self) -> None:
        self.arrived, self.release, self.answered = threading.Event(), threading.Event(), threading.Event()
        tarpit = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", "0")))
                tarpit.arrived.set()
                tarpit.release.wait(120)
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()
                tarpit.answered.set()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/openai"

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_crud_through_the_sdk(stack, receiver_factory):
    client = stack.client()
    url = receiver_factory().url
    created = client.webhooks.create(name="ops", url=url, event_types=["batch.completed", "batch.failed"])
    assert created.object == "webhook_endpoint"
    assert created.id.startswith("whep_")
    assert created.signing_secret.startswith("whsec_")
    assert len(base64.b64decode(created.signing_secret[len("whsec_"):])) >= 24
    assert created.signing_secret_hint.endswith(created.signing_secret[-4:])
    assert created.event_types == ["batch.completed", "batch.failed"]
    assert created.updated_at == created.created_at

    got = client.webhooks.retrieve(created.id)
    assert got.url == url and got.name == "ops"
    assert "signing_secret" not in got.model_dump(), "the secret leaves the server only at create and rotation"

    others = [client.webhooks.create(name=f"n{i}", url=f"{url}?n={i}", event_types=["batch.expired"])
              for i in range(2)]
    page = client.webhooks.list(limit=2)
    assert [e.id for e in page.data] == [others[1].id, others[0].id]  # newest first
    assert page.has_more is True
    assert {e.id for e in client.webhooks.list(limit=1)} == {created.id, others[0].id, others[1].id}  # auto-paging

    same = client.webhooks.update(created.id, name="ops")
    assert same.updated_at == created.updated_at, "an unchanged update does not advance updated_at"
    updated = client.webhooks.update(created.id, name="renamed", event_types=["batch.cancelled"])
    assert (updated.name, updated.event_types) == ("renamed", ["batch.cancelled"])

    rotated = client.webhooks.rotate_secret(created.id)
    assert rotated.signing_secret.startswith("whsec_") and rotated.signing_secret != created.signing_secret

    deleted = client.webhooks.delete(created.id)
    assert (deleted.id, deleted.object, deleted.deleted) == (created.id, "webhook_endpoint.deleted", True)
    with pytest.raises(openai.NotFoundError):
        client.webhooks.retrieve(created.id)
    assert client.webhooks.event_types.list().data == [
        "batch.completed", "batch.failed", "batch.expired", "batch.cancelled"]


def settled(stack, endpoint_id: str, delivery_id: str, timeout: float = 30.0) -> dict:
    """The delivery once it is no longer pending (a hang guard, not a speed bound)."""
    deadline = time.monotonic() + timeout
    while True:
        found = [d for d in deliveries(stack, endpoint_id) if d["id"] == delivery_id]
        if found and found[0]["status"] != "pending":
            return found[0]
        assert time.monotonic() < deadline, f"delivery {delivery_id} still pending: {found}"
        time.sleep(0.05)


def test_webhooks_test_sends_a_verifiable_sample_event(stack, receiver_factory):
    client = stack.client()
    receiver = receiver_factory([200, 503])
    ep = client.webhooks.create(name="t", url=receiver.url, event_types=["batch.completed"])

    raw = client.webhooks.with_raw_response.test(ep.id, event_type="batch.completed")
    assert raw.status_code == 202
    result = raw.parse()
    assert (result.object, result.success, result.status_code, result.webhook_endpoint_id) == (
        "webhook_endpoint.test", True, 202, ep.id)
    assert result.status == "pending" and result.delivery_id.startswith("wh_")
    got = receiver.wait_for(1)[0]
    assert got.headers["webhook-id"] == result.delivery_id
    event = client.webhooks.unwrap(got.body, got.headers, secret=ep.signing_secret)
    assert isinstance(event, BatchCompletedWebhookEvent)
    assert event.data.id.startswith("batch_")
    done = settled(stack, ep.id, result.delivery_id)
    assert (done["status"], done["test"], [a["status_code"] for a in done["attempts"]]) == ("succeeded", True, [200])

    # Non-2xx answers are recorded on the delivery, once: a test event is never retried.
    second = client.webhooks.test(ep.id, event_type="batch.failed")
    got = receiver.wait_for(2)[1]
    assert isinstance(client.webhooks.unwrap(got.body, got.headers, secret=ep.signing_secret),
                      BatchFailedWebhookEvent)
    assert event_json(got)["type"] == "batch.failed"
    failed = settled(stack, ep.id, second.delivery_id)
    assert (failed["status"], failed["next_attempt_at"]) == ("failed", None)
    assert [(a["status_code"], a["error"]) for a in failed["attempts"]] == [(503, "HTTP 503")]


def test_webhooks_test_answers_before_a_tarpit_receiver_does(stack, receiver_factory):
    """M5: the test event is queued, so a receiver that never answers holds no API request."""
    client = stack.client()
    tarpit = Tarpit()
    try:
        stack.settings.notifications.webhook_timeout_seconds = 60.0  # the tarpit, not the timeout, decides when it ends
        ep = client.webhooks.create(name="slow", url=tarpit.url, event_types=["batch.completed"])
        # The tarpit answers only after `release` (set below) and the receiver timeout is 60 s: an API that sent
        # the event itself would hold this call past the client's 30 s and fail it, without retries.
        result = client.with_options(timeout=30, max_retries=0).webhooks.test(ep.id, event_type="batch.completed")
        assert (result.status, result.status_code) == ("pending", 202)
        assert tarpit.arrived.wait(30), "the queued test event reached the receiver"
        assert [d["status"] for d in deliveries(stack, ep.id)] == ["pending"]
        tarpit.release.set()
        done = settled(stack, ep.id, result.delivery_id)
        assert tarpit.answered.is_set()
        assert (done["status"], [a["status_code"] for a in done["attempts"]]) == ("succeeded", [200])
    finally:
        tarpit.close()


def test_webhooks_test_of_an_unreachable_receiver_is_a_failed_delivery(stack):
    client = stack.client()
    ep = client.webhooks.create(name="gone", url=f"http://127.0.0.1:{closed_port()}/hook",
                                event_types=["batch.completed"])
    result = client.webhooks.test(ep.id, event_type="batch.completed")
    assert result.status == "pending"
    done = settled(stack, ep.id, result.delivery_id)
    assert done["status"] == "failed" and done["attempts"][0]["error"] == "connection refused"


def test_rotation_keeping_the_old_secret_signs_with_both(stack, receiver_factory):
    client = stack.client()
    receiver = receiver_factory()
    ep = client.webhooks.create(name="r", url=receiver.url, event_types=["batch.completed"])
    rotated = client.webhooks.rotate_secret(ep.id, keep_old_secret_active_for_24_hours=True)
    client.webhooks.test(ep.id, event_type="batch.completed")
    got = receiver.wait_for(1)[0]
    assert len(got.headers["webhook-signature"].split()) == 2
    for secret in (ep.signing_secret, rotated.signing_secret):
        client.webhooks.verify_signature(got.body, got.headers, secret=secret)

    client.webhooks.rotate_secret(ep.id)  # without keeping: only the newest secret signs
    client.webhooks.test(ep.id, event_type="batch.completed")
    got = receiver.wait_for(2)[1]
    with pytest.raises(openai.InvalidWebhookSignatureError):
        client.webhooks.verify_signature(got.body, got.headers, secret=rotated.signing_secret)


@pytest.mark.parametrize("kwargs, param", [
    ({"event_types": ["response.completed"]}, "event_types[0]"),
    ({"event_types": []}, "event_types"),
    ({"url": "ftp://127.0.0.1/x"}, "url"),
    ({"url": "not a url"}, "url"),
    ({"name": ""}, "name"),
])
def test_invalid_parameters_are_400s_naming_them(stack, kwargs, param):
    client = stack.client()
    args = {"name": "x", "url": "http://127.0.0.1:9/hook", "event_types": ["batch.completed"], **kwargs}
    with pytest.raises(openai.BadRequestError) as e:
        client.webhooks.create(**args)
    assert e.value.param == param


def test_endpoints_are_tenant_scoped(stack):
    endpoints = stack.notifier.endpoints
    mine = endpoints.create("alpha", CreateWebhookEndpointRequest(
        name="a", url="http://127.0.0.1:9/hook", event_types=["batch.completed"]))
    with pytest.raises(Exception, match="No webhook endpoint found"):
        endpoints.get("beta", mine.id)
    assert endpoints.list("beta", limit=20, after=None).data == []
    assert [e.id for e in endpoints.list("alpha", limit=20, after=None).data] == [mine.id]
    client = stack.client()  # the API key's tenant ("default") sees neither
    with pytest.raises(openai.NotFoundError):
        client.webhooks.retrieve(mine.id)


def test_endpoints_are_capped_per_tenant_and_urls_unique(make_stack, receiver_factory):
    """L1: every event fans out to each endpoint, so a tenant gets a bounded number, one per URL."""
    stack = make_stack(max_webhook_endpoints=3)
    client = stack.client()
    url = receiver_factory().url
    first = client.webhooks.create(name="a", url=url, event_types=["batch.completed"])
    with pytest.raises(openai.BadRequestError) as err:
        client.webhooks.create(name="b", url=url, event_types=["batch.failed"])
    assert (err.value.code, err.value.param) == ("duplicate_url", "url")
    second = client.webhooks.create(name="b", url=url + "?b", event_types=["batch.failed"])
    with pytest.raises(openai.BadRequestError) as err:
        client.webhooks.update(second.id, url=url)
    assert err.value.code == "duplicate_url"
    client.webhooks.create(name="c", url=url + "?c", event_types=["batch.failed"])
    with pytest.raises(openai.BadRequestError) as err:
        client.webhooks.create(name="d", url=url + "?d", event_types=["batch.failed"])
    assert err.value.code == "too_many_endpoints"
    client.webhooks.delete(first.id)
    client.webhooks.create(name="d", url=url + "?d", event_types=["batch.failed"])
