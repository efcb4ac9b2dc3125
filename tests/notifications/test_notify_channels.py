"""SNS and SES: the batch object on the topic with the tenant attribute, and emails whose signed links resolve."""

from __future__ import annotations

import json
import logging
import re
import time

import openai
import pytest
import requests

from nightbatch.batches.recipients import check_notify_options, recipients
from nightbatch.errors import InvalidRequestError
from nightbatch.files.links import sign_link
from nightbatch.settings import Settings
from tests.notifications.support import make_batch, ses_messages, sns_notifications


def test_sns_gets_the_batch_object_with_the_tenant_attribute(stack):
    batch_id = make_batch(stack, "completed")
    result = stack.notifier.notify_batch(batch_id)
    [(message_id, message, subject, attributes, _)] = sns_notifications(stack)
    assert message_id == result.sns_message_id
    batch = json.loads(message)
    assert batch == stack.client().batches.retrieve(batch_id).model_dump(mode="json")
    assert (batch["id"], batch["status"], batch["request_counts"]["completed"]) == (batch_id, "completed", 2)
    assert attributes["tenant"] == {"Type": "String", "Value": "default"}  # moto's record of the attribute
    assert attributes["event_type"]["Value"] == "batch.completed"
    assert attributes["event_id"]["Value"] == result.event_id
    assert subject == f"nightbatch batch.completed {batch_id}"


def test_no_topic_configured_means_no_sns(make_stack):
    stack = make_stack(topic_arn="")
    assert stack.notifier.notify_batch(make_batch(stack)).sns_message_id is None


def _email_to(address, batch_id):
    return [m for m in ses_messages() if batch_id in m.subject and address in m.destinations["ToAddresses"]]


def test_email_goes_to_opted_in_and_configured_recipients_with_links_that_resolve(stack, caplog):
    caplog.set_level(logging.INFO, logger="nightbatch.notifications")
    batch_id = make_batch(stack, "completed", email=["alice@example.com"])
    # Create refuses a disallowed domain (below); one can still be stored if the allowed list shrank since.
    stack.adapters.table.update(batch_id, set_={"options": {"notify": {"email": [
        "alice@example.com", "mallory@elsewhere.test"]}}, "ext": {"cost": {
            "gpu_seconds": 120.0, "load_share": 0.1, "instance_type": "g6e.xlarge", "capacity": "spot",
            "estimated_cost_usd": 0.0263, "usd_per_1m_output_tokens": 2.19}}})
    result = stack.notifier.notify_batch(batch_id)
    assert result.emails_sent == 2
    [to_alice] = _email_to("alice@example.com", batch_id)
    assert len(_email_to("ops@example.org", batch_id)) == 1, "configured recipients get every batch"
    assert _email_to("mallory@elsewhere.test", batch_id) == [], "domains outside the allowed list are dropped"
    assert to_alice.source == "nightbatch@example.org"
    assert to_alice.subject == f"[nightbatch] Batch {batch_id} completed (2/3 succeeded)"
    assert "links valid until" in to_alice.body
    body = to_alice.body
    for expected in ("Status:    completed", "3 total, 2 completed, 1 failed", "30 input, 12 output, 42 total",
                     "Duration:", "run=nightly", "120 GPU-seconds on g6e.xlarge (spot), 10% loading",
                     "Cost:      ~$0.0263 (estimate), $2.1900 per 1M output tokens",
                     f'client.batches.retrieve("{batch_id}")'):
        assert expected in body
    # H1: the links are credentials; the log has the batch id and the recipient count, never the text.
    assert f"notify {batch_id}: e-mail to 2 recipient(s)" in caplog.text
    assert "sig=" not in caplog.text and "/download?" not in caplog.text and "Tokens:" not in caplog.text
    expires = [int(x) for x in re.findall(r"expires=(\d+)", body)]
    assert expires and all(e - time.time() <= 24 * 3600 for e in expires), "e-mailed links live a day at most"

    batch = stack.client().batches.retrieve(batch_id)
    links = dict(re.findall(r"(file-\w+): (http\S+)", body))
    assert set(links) == {batch.output_file_id, batch.error_file_id}
    for file_id, link in links.items():
        assert link.startswith(f"{stack.api_url}/v1/nightbatch/files/{file_id}/download?")
        first = requests.get(link, allow_redirects=False, timeout=10)  # no API key: the signature is the key
        assert first.status_code == 307
        presigned = first.headers["location"]
        assert presigned.startswith(stack.moto_url) and "X-Amz-Signature" in presigned
        content = requests.get(presigned, timeout=10)
        assert content.status_code == 200
        assert content.content == stack.client().files.content(file_id).read()
    assert b'"custom_id":"a"' in requests.get(links[batch.output_file_id], timeout=10).content


def test_altered_or_expired_links_are_refused(stack):
    batch_id = make_batch(stack, "completed")
    file_id = stack.client().batches.retrieve(batch_id).output_file_id
    stack.notifier.notify_batch(batch_id)
    [mail] = _email_to("ops@example.org", batch_id)
    link = re.search(rf"{file_id}: (http\S+)", mail.body).group(1)
    other = stack.client().batches.retrieve(make_batch(stack, "completed")).output_file_id
    for bad in (link.replace("sig=", "sig=x"), link.replace(file_id, other), link.replace("expires=", "expires=1")):
        resp = requests.get(bad, allow_redirects=False, timeout=10)
        assert resp.status_code == 403 and resp.json()["error"]["code"] == "invalid_link"
    expired = sign_link(stack.settings, file_id, ttl_seconds=-1)
    resp = requests.get(stack.api_url + expired.path, allow_redirects=False, timeout=10)
    assert resp.status_code == 403 and resp.json()["error"]["code"] == "link_expired"


def test_failed_batch_email_lists_the_errors_and_has_no_links(stack):
    batch_id = make_batch(stack, "failed", email="bob@example.com")
    stack.notifier.notify_batch(batch_id)
    [mail] = _email_to("bob@example.com", batch_id)
    assert mail.subject == f"[nightbatch] Batch {batch_id} failed"
    assert "line 1: invalid_json_line: This line is not parseable as valid JSON." in mail.body
    assert "http" not in mail.body


def test_without_a_sender_nothing_is_sent_and_only_the_count_is_logged(make_stack, caplog):
    caplog.set_level(logging.INFO, logger="nightbatch.notifications")
    stack = make_stack(email_sender="")
    batch_id = make_batch(stack, "completed", email="carol@example.com")
    assert stack.notifier.notify_batch(batch_id).emails_sent == 0
    assert _email_to("carol@example.com", batch_id) == []
    assert f"notify {batch_id}: e-mail to 2 recipient(s)" in caplog.text
    assert "no sender identity" in caplog.text
    assert "sig=" not in caplog.text and "carol@" not in caplog.text


def test_notify_options_are_checkable_at_batch_create(stack):
    s = stack.settings
    check_notify_options({"notify": {"email": ["a@example.com", "b@EXAMPLE.com"]}}, s)
    check_notify_options(None, s)
    for bad in ("a@elsewhere.test", "not-an-address", ["x@example.com"] * 11, ["ok@example.com", 3]):
        with pytest.raises(InvalidRequestError) as e:
            check_notify_options({"notify": {"email": bad}}, s)
        assert e.value.param == "nightbatch.notify.email"


@pytest.mark.parametrize(("mode", "domains", "allowed"), [
    ("aws", "", False),  # a deployment that lists no domain e-mails no batch-named address
    ("aws", "*", True),
    ("aws", "example.com", True),
    ("aws", "other.test", False),
    ("local", "", True),  # the embedded SES sends nothing
    ("local", "other.test", False),
])
def test_empty_allowed_domains_allow_none_in_aws_and_any_locally(mode, domains, allowed):
    s = Settings(deployment={"mode": mode},
                 notifications={"email_allowed_domains": domains, "email_recipients": "ops@example.org"})
    options = {"notify": {"email": "alice@example.com"}}
    assert recipients(s, options) == ((["ops@example.org", "alice@example.com"], []) if allowed else
                                      (["ops@example.org"], ["alice@example.com"])), "operators' are never checked"
    if allowed:
        check_notify_options(options, s)
    else:
        with pytest.raises(InvalidRequestError, match="NIGHTBATCH_EMAIL_ALLOWED_DOMAINS"):
            check_notify_options(options, s)


def test_batch_create_refuses_bad_or_disallowed_addresses_with_a_400(stack):
    client = stack.client()
    line = b'{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"m","messages":[]}}\n'
    file = client.files.create(file=("in.jsonl", line), purpose="batch")
    for bad in ("mallory@elsewhere.test", "not-an-address", ["ok@example.com"] * 11):
        with pytest.raises(openai.BadRequestError) as e:
            client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h",
                                  extra_body={"nightbatch": {"notify": {"email": bad}}})
        assert e.value.status_code == 400 and e.value.param == "nightbatch.notify.email", bad
    assert client.batches.list().data == [], "a refused create stores no batch"
    ok = client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h",
                               extra_body={"nightbatch": {"notify": {"email": "alice@EXAMPLE.com"}}})
    assert ok.status == "validating"


def test_a_rejected_email_is_logged_and_not_retried(make_stack, caplog, receiver_factory):
    """SES refuses for good (here: an unverified sender; in the sandbox: an unverified recipient)."""
    stack = make_stack(email_sender="nightbatch@unverified.test")
    receiver = receiver_factory()
    stack.client().webhooks.create(name="w", url=receiver.url, event_types=["batch.completed"])
    batch_id = make_batch(stack, "completed", email="erin@example.com")
    first = stack.notifier.notify_batch(batch_id)  # does not raise: the workflow must not fail over it
    assert first.emails_sent == 0 and first.deliveries_enqueued == 1
    assert "SES rejected the e-mail to erin@example.com" in caplog.text
    caplog.clear()
    assert stack.notifier.notify_batch(batch_id).emails_sent == 0
    assert "SES rejected" not in caplog.text, "a rejected address is not tried again"
    assert _email_to("erin@example.com", batch_id) == []
    receiver.wait_for(1)
