"""The Lambda entry points as AWS runs them: Notify enqueues to SQS, the SQS-triggered Deliver attempts and
re-enqueues with backoff (and re-enqueues again past SQS's 15-minute delay cap); the local embedded AWS."""

from __future__ import annotations

import json
import time

import pytest
from moto.core.models import DEFAULT_ACCOUNT_ID
from moto.sqs.models import sqs_backends

from functions.tasks import deliver, notify
from nightbatch.aws import make_adapters
from nightbatch.local.aws import start_embedded_aws
from nightbatch.local.stack import local_settings
from nightbatch.notifications.objects import DeliveryMessage
from nightbatch.settings import get_settings
from nightbatch.wiring import default_services
from tests.conftest import REGION
from tests.notifications.support import deliveries, make_batch


@pytest.fixture
def aws_env(make_stack, monkeypatch):
    """A stack in aws mode whose settings reach the handlers the way a Lambda's environment does."""
    stack = make_stack(mode="aws", webhook_retry_base_seconds=1.0)
    queue_name = f"{stack.settings.deployment.table}-deliveries"
    queue_url = stack.adapters.client("sqs").create_queue(QueueName=queue_name)["QueueUrl"]
    s = stack.settings
    env = {"MODE": "aws", "REGION": REGION, "BUCKET": s.deployment.bucket, "TABLE": s.deployment.table,
           "TOPIC_ARN": s.notifications.topic_arn,
           "WEBHOOK_QUEUE_URL": queue_url, "WEBHOOK_RETRY_BASE_SECONDS": "1", "WEBHOOK_TIMEOUT_SECONDS": "2",
           # the test's receivers are on loopback; the SSRF rules themselves are tested elsewhere
           "ALLOW_PRIVATE_TARGETS": "true", "EMAIL_SENDER": s.notifications.email_sender, "API_KEY": s.api.api_key,
           "LINK_SECRET": s.links.secret, "PUBLIC_BASE_URL": s.notifications.public_base_url}
    for k, v in env.items():
        monkeypatch.setenv(f"NIGHTBATCH_{k}", v)
    monkeypatch.setenv("AWS_ENDPOINT_URL", stack.moto_url)
    _forget_cached_services()
    yield stack, queue_url, queue_name
    _forget_cached_services()


def _forget_cached_services():
    get_settings.cache_clear()
    default_services.cache_clear()


def _receive(stack, queue_url, wait):
    sqs = stack.adapters.client("sqs")
    resp = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=wait)
    records = [{"messageId": m["MessageId"], "body": m["Body"]} for m in resp.get("Messages", [])]
    for m in resp.get("Messages", []):
        sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=m["ReceiptHandle"])
    return records


def test_notify_enqueues_and_deliver_attempts_then_retries_through_sqs(aws_env, receiver_factory):
    stack, queue_url, _ = aws_env
    receiver = receiver_factory([503, 200])
    ep = stack.client().webhooks.create(name="sqs", url=receiver.url, event_types=["batch.completed"])
    batch_id = make_batch(stack, "completed")

    out = notify.handler({"version": 1, "batch_id": batch_id, "status": "completed"}, None)
    assert out["status"] == "notified" and out["deliveries_enqueued"] == 1 and out["sns_message_id"]
    assert receiver.received == [], "Notify only enqueues; the Deliver Lambda sends"

    records = _receive(stack, queue_url, wait=1)
    assert len(records) == 1 and json.loads(records[0]["body"])["attempt"] == 1
    assert deliver.handler({"Records": records}, None) == {"batchItemFailures": []}
    assert len(receiver.received) == 1

    retry = []
    deadline = time.monotonic() + 5
    while not retry and time.monotonic() < deadline:
        retry = _receive(stack, queue_url, wait=1)  # SQS holds it for DelaySeconds (the 1 s backoff)
    assert len(retry) == 1 and json.loads(retry[0]["body"])["attempt"] == 2
    assert deliver.handler({"Records": retry}, None) == {"batchItemFailures": []}
    assert len({r.headers["webhook-id"] for r in receiver.received}) == 1 and len(receiver.received) == 2
    [delivery] = deliveries(stack, ep.id)
    assert delivery["status"] == "succeeded" and [a["status_code"] for a in delivery["attempts"]] == [503, 200]

    # A duplicate of an already-handled message (SQS is at-least-once) does nothing.
    assert deliver.handler({"Records": records}, None) == {"batchItemFailures": []}
    assert len(receiver.received) == 2


def test_a_long_delay_is_reenqueued_in_15_minute_steps(aws_env):
    _, _, queue_name = aws_env
    far = DeliveryMessage(delivery_id="wh_later", attempt=3, not_before=time.time() + 3000).model_dump()
    deliver.handler({"Records": [{"messageId": "m1", "body": json.dumps(far)}]}, None)
    queue = sqs_backends[DEFAULT_ACCOUNT_ID][REGION].queues[queue_name]
    [message] = queue._messages
    assert json.loads(message.body) == far, "the same message, put back"
    assert 899 <= (message.delayed_until / 1000 - time.time()) <= 901, "SQS's cap: 900 s"


def test_a_broken_message_is_reported_for_sqs_to_redeliver_then_dead_letter(aws_env):
    out = deliver.handler({"Records": [{"messageId": "bad-1", "body": "{not json"}]}, None)
    assert out == {"batchItemFailures": [{"itemIdentifier": "bad-1"}]}


def test_local_embedded_aws_has_the_topic_and_a_verified_sender(monkeypatch):
    for k in ("AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION", "MOTO_PORT"):
        monkeypatch.setenv(k, "restored-after-the-test")  # start_embedded_aws sets them for its process
    settings = local_settings(table="nb-local-notify", bucket="nb-local-notify")
    aws = start_embedded_aws(settings)
    try:
        assert aws.topic_arn.endswith(":nightbatch-events")
        adapters = make_adapters(settings, endpoint_url=aws.endpoint_url)
        ses = adapters.client("ses")
        ses.send_email(Source=settings.notifications.email_sender, Destination={"ToAddresses": ["x@example.com"]},
                       Message={"Subject": {"Data": "s"}, "Body": {"Text": {"Data": "b"}}})
        assert settings.notifications.allow_private_targets
    finally:
        aws.stop()
