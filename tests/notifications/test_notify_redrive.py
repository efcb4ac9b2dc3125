"""M2: a transient channel failure (an SES throttle) keeps the event open; Notify's retry or the sweeper's re-drive
sends what is missing, and the event closes once every channel is done."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError

from nightbatch.notifications.events import PENDING, event_pk
from nightbatch.notifications.notifier import NotifyError
from nightbatch.pipeline.sweep import sweep
from tests.notifications.support import make_batch, ses_messages


def test_a_throttled_email_is_sent_by_the_sweeper_s_redrive(stack, monkeypatch):
    batch_id = make_batch(stack, "completed", email="dana@example.com")
    mailer = stack.notifier.mailer
    real_send = mailer.send_text

    def throttled(to, **kw):
        raise ClientError({"Error": {"Code": "Throttling", "Message": "Maximum sending rate exceeded."}},
                          "SendEmail")

    monkeypatch.setattr(mailer, "send_text", throttled)
    with pytest.raises(NotifyError):
        stack.notifier.notify_batch(batch_id)
    event = stack.adapters.table.get(event_pk(batch_id, "completed"))
    assert event["open_status"] == PENDING, "an event with a channel left stays open"
    assert [e for e in ses_messages() if batch_id in e.subject] == []

    monkeypatch.setattr(mailer, "send_text", real_send)
    assert sweep(stack.services, notify=stack.notifier.notify_batch)["renotified"] == [], "Notify's retries first"
    report = sweep(stack.services, notify=stack.notifier.notify_batch, notify_grace_seconds=-1)
    assert report["renotified"] == [batch_id]
    sent = [e for e in ses_messages() if batch_id in e.subject]
    assert {a for m in sent for a in m.destinations["ToAddresses"]} == {"dana@example.com", "ops@example.org"}
    assert "open_status" not in stack.adapters.table.get(event_pk(batch_id, "completed"))
    assert sweep(stack.services, notify=stack.notifier.notify_batch, notify_grace_seconds=-1)["renotified"] == []
