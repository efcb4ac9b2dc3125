"""Webhook endpoints through the real OpenAI SDK: create, retrieve, list, update, rotate, delete, test."""

from __future__ import annotations

import base64

import openai
import pytest
from openai.types.webhooks import BatchCompletedWebhookEvent, BatchFailedWebhookEvent

from nightbatch.notifications.models import CreateWebhookEndpointRequest
from tests.notify.support import event_json


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


def test_webhooks_test_sends_a_verifiable_sample_event(stack, receiver_factory):
    client = stack.client()
    receiver = receiver_factory([200, 503])
    ep = client.webhooks.create(name="t", url=receiver.url, event_types=["batch.completed"])

    result = client.webhooks.test(ep.id, event_type="batch.completed")
    assert (result.object, result.success, result.status_code, result.webhook_endpoint_id) == (
        "webhook_endpoint.test", True, 200, ep.id)
    got = receiver.wait_for(1)[0]
    event = client.webhooks.unwrap(got.body, got.headers, secret=ep.signing_secret)
    assert isinstance(event, BatchCompletedWebhookEvent)
    assert event.data.id.startswith("batch_")

    # Non-2xx answers are reported, not raised (the SDK types success as always true).
    assert client.webhooks.test(ep.id, event_type="batch.failed").status_code == 503
    second = receiver.wait_for(2)[1]
    assert isinstance(client.webhooks.unwrap(second.body, second.headers, secret=ep.signing_secret),
                      BatchFailedWebhookEvent)
    assert event_json(second)["type"] == "batch.failed"


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
