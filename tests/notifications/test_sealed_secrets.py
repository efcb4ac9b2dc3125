"""Webhook signing secrets are sealed with the stack's KMS key: the table holds ciphertext bound to the endpoint,
and deliveries still sign with the real secret (verified by the SDK's unwrap)."""

from __future__ import annotations

import base64

import pytest
from botocore.exceptions import ClientError

from nightbatch.aws.kms import PREFIX
from tests.notifications.support import make_batch


@pytest.fixture
def sealed_stack(make_stack, moto_server):
    import boto3

    kms = boto3.client("kms", region_name="us-east-1", endpoint_url=moto_server.endpoint_url)
    key = kms.create_key(Description="nightbatch test")["KeyMetadata"]["Arn"]
    return make_stack(secrets_kms_key=key)


def test_the_table_never_holds_a_signing_secret(sealed_stack, receiver_factory):
    stack = sealed_stack
    client = stack.client()
    receiver = receiver_factory()
    ep = client.webhooks.create(name="sealed", url=receiver.url, event_types=["batch.completed"])
    item = stack.adapters.table.get(ep.id)
    assert item["secret"].startswith(PREFIX) and ep.signing_secret not in str(item)
    assert ep.signing_secret[len("whsec_"):] not in base64.b64decode(item["secret"][len(PREFIX):]).decode("latin-1")
    assert client.webhooks.retrieve(ep.id).signing_secret_hint.endswith(ep.signing_secret[-4:])

    stack.notifier.notify_batch(make_batch(stack))
    got = receiver.wait_for(1)[0]
    client.webhooks.unwrap(got.body, got.headers, secret=ep.signing_secret)  # signed with the real secret

    rotated = client.webhooks.rotate_secret(ep.id)
    fresh = stack.adapters.table.get(ep.id)
    assert fresh["secret"].startswith(PREFIX) and fresh["secret"] != item["secret"]
    assert rotated.signing_secret not in str(fresh)

    # Bound to its endpoint: a sealed secret copied onto another item does not open.
    other = client.webhooks.create(name="other", url=receiver.url + "?o", event_types=["batch.failed"])
    with pytest.raises(ClientError):
        stack.notifier.endpoints.sealer.open(fresh["secret"], other.id)
