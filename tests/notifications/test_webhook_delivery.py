"""Deliveries of batch events to loopback receivers: verified by the SDK's unwrap, retried with backoff."""

from __future__ import annotations

import pytest
from openai.types.webhooks import (
    BatchCancelledWebhookEvent,
    BatchCompletedWebhookEvent,
    BatchExpiredWebhookEvent,
    BatchFailedWebhookEvent,
)

from nightbatch.notifications.delivery import delivery_id
from tests.notifications.support import deliveries, event_json, make_batch

EVENT_CLASSES = {
    "completed": BatchCompletedWebhookEvent, "failed": BatchFailedWebhookEvent,
    "expired": BatchExpiredWebhookEvent, "cancelled": BatchCancelledWebhookEvent,
}


@pytest.mark.parametrize("status", ["completed", "failed", "expired", "cancelled"])
def test_terminal_batch_event_is_delivered_and_verifies(stack, receiver_factory, status):
    client = stack.client()
    receiver, other = receiver_factory(), receiver_factory()
    ep = client.webhooks.create(name="all", url=receiver.url, event_types=[f"batch.{status}"])
    unrelated = "batch.failed" if status != "failed" else "batch.completed"
    client.webhooks.create(name="other", url=other.url, event_types=[unrelated])
    batch_id = make_batch(stack, status)

    result = stack.notifier.notify_batch(batch_id)
    assert result.event_type == f"batch.{status}" and result.deliveries_enqueued == 1
    got = receiver.wait_for(1)[0]
    event = client.webhooks.unwrap(got.body, got.headers, secret=ep.signing_secret)
    assert isinstance(event, EVENT_CLASSES[status])
    batch = client.batches.retrieve(batch_id)
    assert (event.id, event.data.id, event.object) == (result.event_id, batch_id, "event")
    assert event.created_at == getattr(batch, f"{status}_at"), "created_at is when the batch reached the status"
    assert event_json(got) == {"id": result.event_id, "object": "event", "type": f"batch.{status}",
                               "created_at": event.created_at, "data": {"id": batch_id}}
    assert got.headers["webhook-id"].startswith("wh_")
    assert got.headers["content-type"] == "application/json"
    assert stack.notifier.queue.wait_idle(20)
    assert other.received == [], "an endpoint gets only the event types it subscribed to"


def test_retries_after_500s_keep_the_webhook_id_and_sign_each_attempt_afresh(make_stack, receiver_factory):
    stack = make_stack(webhook_retry_base_seconds=0.6)
    client = stack.client()
    receiver = receiver_factory([500, 502, 200])
    ep = client.webhooks.create(name="flaky", url=receiver.url, event_types=["batch.completed"])
    batch_id = make_batch(stack)
    stack.notifier.notify_batch(batch_id)

    got = receiver.wait_for(3)
    assert len({r.headers["webhook-id"] for r in got}) == 1, "receivers deduplicate on webhook-id"
    assert len({r.body for r in got}) == 1, "every attempt sends the same bytes"
    stamps = [int(r.headers["webhook-timestamp"]) for r in got]
    assert stamps == sorted(stamps) and stamps[-1] > stamps[0], "each attempt carries a fresh timestamp"
    assert got[1].at - got[0].at >= 0.5 and got[2].at - got[1].at >= 1.1, "exponential backoff from the base"
    for r in got:
        assert client.webhooks.unwrap(r.body, r.headers, secret=ep.signing_secret).data.id == batch_id
    assert stack.notifier.queue.wait_idle(20)

    [delivery] = deliveries(stack, ep.id)
    assert delivery["id"] == got[0].headers["webhook-id"]
    assert delivery["status"] == "succeeded" and delivery["event_id"] == event_json(got[0])["id"]
    assert [a["status_code"] for a in delivery["attempts"]] == [500, 502, 200]
    assert [a["attempt"] for a in delivery["attempts"]] == [1, 2, 3]
    assert delivery["attempts"][0]["next_attempt_at"] is not None
    assert delivery["attempts"][2]["next_attempt_at"] is None and delivery["next_attempt_at"] is None


def test_a_receiver_that_times_out_is_retried(make_stack, receiver_factory):
    stack = make_stack(webhook_timeout_seconds=1.0)
    client = stack.client()
    receiver = receiver_factory([("sleep", 2.5), 200])
    ep = client.webhooks.create(name="slow", url=receiver.url, event_types=["batch.completed"])
    stack.notifier.notify_batch(make_batch(stack))
    receiver.wait_for(2)
    assert stack.notifier.queue.wait_idle(20)
    [delivery] = deliveries(stack, ep.id)
    first, second = delivery["attempts"]
    assert first["status_code"] is None and "timed out" in first["error"]
    assert second["status_code"] == 200 and delivery["status"] == "succeeded"


def test_gives_up_once_the_event_is_older_than_the_max_age(make_stack, receiver_factory):
    stack = make_stack(webhook_retry_base_seconds=0.2, webhook_max_age_seconds=1.0)
    client = stack.client()
    receiver = receiver_factory([500] * 20)
    ep = client.webhooks.create(name="down", url=receiver.url, event_types=["batch.completed"])
    stack.notifier.notify_batch(make_batch(stack))
    assert stack.notifier.queue.wait_idle(20)
    [delivery] = deliveries(stack, ep.id)
    # attempts at ~0, 0.2 and 0.6 s; the next (1.4 s) would be past the 1 s max age (fewer on a loaded machine)
    assert delivery["status"] == "failed"
    assert 2 <= len(delivery["attempts"]) <= 3
    assert {a["status_code"] for a in delivery["attempts"]} == {500}
    assert delivery["attempts"][-1]["next_attempt_at"] is None
    assert len(receiver.received) == len(delivery["attempts"])


def test_redirects_are_not_followed(make_stack, receiver_factory):
    stack = make_stack(webhook_max_age_seconds=0.1)
    client = stack.client()
    elsewhere = receiver_factory()
    receiver = receiver_factory([("redirect", elsewhere.url)])
    ep = client.webhooks.create(name="moved", url=receiver.url, event_types=["batch.completed"])
    stack.notifier.notify_batch(make_batch(stack))
    assert stack.notifier.queue.wait_idle(20)
    [delivery] = deliveries(stack, ep.id)
    assert delivery["attempts"][0]["status_code"] == 302
    assert delivery["attempts"][0]["error"] == "redirects are not followed"
    assert elsewhere.received == []


def test_a_deleted_endpoint_stops_its_retries(make_stack, receiver_factory):
    stack = make_stack(webhook_retry_base_seconds=1.5)
    client = stack.client()
    receiver = receiver_factory([500] * 5)
    ep = client.webhooks.create(name="gone", url=receiver.url, event_types=["batch.completed"])
    result = stack.notifier.notify_batch(make_batch(stack))
    receiver.wait_for(1)
    stack.notifier.endpoints.delete("default", ep.id)
    assert stack.notifier.queue.wait_idle(20)
    assert len(receiver.received) == 1
    item = stack.adapters.table.get(delivery_id(result.event_id, ep.id))
    assert item["status"] == "failed" and item["attempts"][-1]["error"] == "the webhook endpoint was deleted"


class _RecordingQueue:
    def __init__(self):
        self.sent = []

    def send(self, message, delay):
        self.sent.append(message)

    def close(self):
        pass


def test_a_retry_is_queued_before_its_attempt_is_recorded(stack, receiver_factory, monkeypatch):
    """L10: a crash between the attempt and its record must not strand the delivery as `pending`."""
    receiver = receiver_factory([500, 200])
    ep = stack.client().webhooks.create(name="flaky", url=receiver.url, event_types=["batch.completed"])
    deliveries_ = stack.notifier.deliveries
    queue = _RecordingQueue()
    monkeypatch.setattr(deliveries_, "queue", queue)
    result = stack.notifier.notify_batch(make_batch(stack))
    [first] = queue.sent
    did = delivery_id(result.event_id, ep.id)
    real_update = deliveries_.table.update

    def crash(pk, **kw):
        if pk == did:
            raise RuntimeError("the process died before recording the attempt")
        return real_update(pk, **kw)

    monkeypatch.setattr(deliveries_.table, "update", crash)
    with pytest.raises(RuntimeError):
        deliveries_.handle_message(first)
    monkeypatch.setattr(deliveries_.table, "update", real_update)
    assert len(queue.sent) == 2 and queue.sent[1]["attempt"] == 2, "the retry was queued first"
    retry = {**queue.sent[1], "not_before": 0}
    attempt = deliveries_.handle_message(retry)
    assert attempt is not None and attempt.status_code == 200
    assert stack.adapters.table.get(did)["status"] == "succeeded"
    assert len(receiver.received) == 2
