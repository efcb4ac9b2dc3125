"""One event per terminal transition: Notify run twice (or concurrently) sends nothing twice."""

from __future__ import annotations

import io
import threading

import pytest

from nightbatch.batches.request import CreateBatchRequest
from nightbatch.notifications import NotifyError
from nightbatch.notifications.events import event_pk
from tests.notifications.support import deliveries, make_batch, ses_messages, sns_notifications


def test_notify_twice_makes_one_event_one_delivery_one_sns_message_one_email_each(stack, receiver_factory):
    client = stack.client()
    receiver = receiver_factory()
    ep = client.webhooks.create(name="once", url=receiver.url, event_types=["batch.completed"])
    batch_id = make_batch(stack, "completed", email="alice@example.com")

    first = stack.notifier.notify_batch(batch_id)
    second = stack.notifier.notify_batch(batch_id)
    assert first.event_created and not second.event_created
    assert first.event_id == second.event_id
    assert (first.deliveries_enqueued, second.deliveries_enqueued) == (1, 0)
    assert (first.emails_sent, second.emails_sent) == (2, 0)
    assert second.sns_message_id == first.sns_message_id
    assert stack.notifier.queue.wait_idle(20)

    assert len(receiver.received) == 1
    assert len(deliveries(stack, ep.id)) == 1
    assert len(sns_notifications(stack)) == 1
    assert len([m for m in ses_messages() if batch_id in m.subject]) == 2
    event = stack.adapters.table.get(event_pk(batch_id, "completed"))
    assert event["event_id"] == first.event_id and event["created_at"] == client.batches.retrieve(batch_id).completed_at


def test_concurrent_notifies_agree_on_one_event(stack, receiver_factory):
    receiver = receiver_factory()
    stack.client().webhooks.create(name="race", url=receiver.url, event_types=["batch.completed"])
    batch_id = make_batch(stack, "completed")
    results = []
    threads = [threading.Thread(target=lambda: results.append(stack.notifier.notify_batch(batch_id)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({r.event_id for r in results}) == 1
    assert sum(r.event_created for r in results) == 1
    assert stack.notifier.queue.wait_idle(20)
    assert len({r.headers["webhook-id"] for r in receiver.received}) == 1


def test_a_batch_that_is_not_terminal_is_not_notified(stack):
    line = b'{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{}}\n'
    f = stack.services.files.create("default", filename="in.jsonl", purpose="batch", fileobj=io.BytesIO(line),
                                    size=len(line))
    batch = stack.services.batches.create("default", CreateBatchRequest(
        input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"))
    assert stack.notifier.notify_batch(batch.id).status == "not_terminal"
    assert stack.notifier.notify_batch("batch_missing").status == "missing"
    assert sns_notifications(stack) == []


def test_a_failed_channel_is_completed_by_the_retry_without_repeating_the_others(make_stack, receiver_factory):
    missing_topic = "arn:aws:sns:us-east-1:123456789012:created-later"
    stack = make_stack(topic_arn=missing_topic)
    receiver = receiver_factory()
    stack.client().webhooks.create(name="w", url=receiver.url, event_types=["batch.expired"])
    batch_id = make_batch(stack, "expired", email="dave@example.com")

    with pytest.raises(NotifyError, match="sns"):
        stack.notifier.notify_batch(batch_id)  # the topic does not exist yet: Step Functions retries the step
    receiver.wait_for(1)
    emails = [m for m in ses_messages() if batch_id in m.subject]
    assert len(emails) == 2

    stack.adapters.sns.create_topic(Name="created-later")
    again = stack.notifier.notify_batch(batch_id)
    assert again.sns_message_id is not None and again.emails_sent == 0 and again.deliveries_enqueued == 0
    assert len(sns_notifications(stack)) == 1
    assert len([m for m in ses_messages() if batch_id in m.subject]) == 2
    assert stack.notifier.queue.wait_idle(20)
    assert len(receiver.received) == 1
