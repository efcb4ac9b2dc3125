"""SSRF: private, loopback, link-local targets are refused at creation and at delivery, without a connection."""

from __future__ import annotations

import functools
import ipaddress
import socket
import ssl

import openai
import pytest

from nightbatch.notifications import transport
from nightbatch.notifications.delivery import delivery_id
from nightbatch.notifications.objects import CreateWebhookEndpointRequest
from nightbatch.notifications.targets import TargetRefusedError, refusal, resolve_target
from nightbatch.wiring import build_notifier
from tests.notifications.support import TlsReceiver, deliveries, make_batch, self_signed_certificate

REFUSED_IN_AWS = [
    "https://10.0.0.1/hook",
    "https://169.254.169.254/latest/meta-data/iam/security-credentials/",
    "https://127.0.0.1/hook",
    "https://localhost/hook",
    "https://[::1]/hook",
    "https://[::ffff:10.0.0.1]/hook",
    "https://[fe80::1]/hook",
    "https://192.168.1.20:8443/hook",
    "https://172.16.0.5/hook",
    "https://100.64.0.1/hook",
    "https://0.0.0.0/hook",
    "https://224.0.0.1/hook",
    "https://[2002:0a00:0001::1]/hook",  # 6to4 wrapping 10.0.0.1
    "http://93.184.216.34/hook",  # public, but plain HTTP
    "https://user:pw@93.184.216.34/hook",
]


def test_refused_at_creation_in_aws_without_any_connection(make_stack, connection_guard):
    client = make_stack(mode="aws", allow_private_targets=False).client()
    for url in REFUSED_IN_AWS:
        with pytest.raises(openai.BadRequestError) as e:
            client.webhooks.create(name="x", url=url, event_types=["batch.completed"])
        assert (e.value.param, e.value.code) == ("url", "invalid_url"), url
    assert connection_guard.attempts == []
    assert client.webhooks.list().data == []


def test_message_names_the_address_and_the_reason(make_stack):
    stack = make_stack(mode="aws", allow_private_targets=False)
    with pytest.raises(openai.BadRequestError) as e:
        stack.client().webhooks.create(name="x", url="https://169.254.169.254/", event_types=["batch.completed"])
    assert "169.254.169.254" in e.value.message and "link-local" in e.value.message


def test_public_targets_are_accepted_in_aws(make_stack, connection_guard):
    stack = make_stack(mode="aws", allow_private_targets=False)
    ep = stack.client().webhooks.create(name="x", url="https://93.184.216.34/hook", event_types=["batch.failed"])
    assert ep.url == "https://93.184.216.34/hook"
    assert connection_guard.attempts == [], "creation resolves and checks; it does not connect"


def test_local_mode_allows_loopback_and_private_but_never_link_local(make_stack):
    client = make_stack(allow_private_targets=True).client()
    for url in ("http://127.0.0.1:9/hook", "http://10.0.0.1/hook", "http://[::1]:9/hook"):
        client.webhooks.create(name="x", url=url, event_types=["batch.completed"])
    for url in ("http://169.254.169.254/", "http://[fe80::1]/", "http://224.0.0.1/", "http://0.0.0.0/"):
        with pytest.raises(openai.BadRequestError):
            client.webhooks.create(name="x", url=url, event_types=["batch.completed"])


@pytest.mark.parametrize("address, allow_private, refused", [
    ("10.0.0.1", False, True), ("10.0.0.1", True, False), ("127.0.0.1", False, True), ("127.0.0.1", True, False),
    ("169.254.169.254", True, True), ("fd00:ec2::254", False, True), ("::ffff:169.254.169.254", True, True),
    ("93.184.216.34", False, False), ("2606:2800:220:1:248:1893:25c8:1946", False, False),
    ("198.18.0.1", False, True), ("240.0.0.1", True, True), ("255.255.255.255", True, True),
])
def test_address_rules(address, allow_private, refused):
    assert (refusal(ipaddress.ip_address(address), allow_private=allow_private) is not None) is refused


def test_a_name_with_one_private_record_is_refused():
    def resolver(host, port, type=0):
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", port)),
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.1", port))]

    with pytest.raises(TargetRefusedError):
        resolve_target("https://hooks.example.com/x", allow_private=False, resolver=resolver)


def test_refused_at_delivery_when_dns_changed_after_creation(make_stack, connection_guard):
    """The name resolved to a public address at creation and to the metadata service at delivery."""
    answers = {"hooks.example.com": "93.184.216.34"}

    def resolver(host, port, type=0):
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (answers[host], port))]

    stack = make_stack(mode="aws", allow_private_targets=False)
    notifier = build_notifier(stack.adapters, resolver=resolver)
    ep = notifier.endpoints.create("default", CreateWebhookEndpointRequest(
        name="x", url="https://hooks.example.com/hook", event_types=["batch.completed"]))
    answers["hooks.example.com"] = "169.254.169.254"
    result = notifier.notify_batch(make_batch(stack))
    assert result.deliveries_enqueued == 0, "no queue configured in this aws-mode test: deliver by hand"
    attempt = notifier.deliveries.deliver_once(delivery_id(result.event_id, ep.id))
    assert attempt is not None and attempt.status_code is None
    assert "169.254.169.254" in attempt.error and "link-local" in attempt.error
    assert connection_guard.attempts == []
    [listed] = deliveries(stack, ep.id)
    assert listed["attempts"][0]["error"] == attempt.error


def test_delivery_connects_to_the_checked_address_without_resolving_again(make_stack, receiver_factory,
                                                                         monkeypatch):
    receiver = receiver_factory()
    port = int(receiver.url.split(":")[2].split("/")[0])
    calls = []

    def resolver(host, port, type=0):
        calls.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]

    real_getaddrinfo = socket.getaddrinfo

    def no_second_lookup(host, *args, **kwargs):
        assert host != "receiver.test", "the transport must not resolve the name again"
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", no_second_lookup)
    stack = make_stack()
    notifier = build_notifier(stack.adapters, resolver=resolver)
    try:
        notifier.endpoints.create("default", CreateWebhookEndpointRequest(
            name="x", url=f"http://receiver.test:{port}/hook", event_types=["batch.completed"]))
        notifier.notify_batch(make_batch(stack))
        got = receiver.wait_for(1)[0]
    finally:
        notifier.close()
    assert got.headers["host"] == f"receiver.test:{port}"
    assert calls == ["receiver.test", "receiver.test"]  # once at creation, once for the one attempt


def test_https_delivery_to_the_pinned_address_verifies_the_certificate_for_the_host_name(
        make_stack, tmp_path):
    """The connection goes to the checked IP, while SNI, certificate checks and Host name the URL's host."""
    cert, key = self_signed_certificate("receiver.test", tmp_path)
    receiver = TlsReceiver(cert, key)
    try:
        def resolver(host, port, type=0):
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]

        stack = make_stack(webhook_max_age_seconds=0.1)  # one attempt each, no retries
        trusting = functools.partial(transport.post, tls=ssl.create_default_context(cafile=cert))
        for post, expect_ok in ((trusting, True), (transport.post, False)):
            notifier = build_notifier(stack.adapters, resolver=resolver, post=post)
            try:
                ep = notifier.endpoints.create("default", CreateWebhookEndpointRequest(
                    name="tls", url=f"https://receiver.test:{receiver.port}/hook", event_types=["batch.completed"]))
                result = notifier.notify_batch(make_batch(stack))
                assert notifier.queue.wait_idle(20)
                attempt = stack.adapters.table.get(delivery_id(result.event_id, ep.id))["attempts"][0]
                notifier.endpoints.delete("default", ep.id)  # one endpoint per URL
            finally:
                notifier.close()
            if expect_ok:
                assert attempt["status_code"] == 200
                got = receiver.wait_for(1)[0]
                assert got.headers["host"] == f"receiver.test:{receiver.port}"
            else:  # the system trust store does not know the test's certificate: verification is on
                assert attempt["status_code"] is None and "CERTIFICATE_VERIFY_FAILED" in attempt["error"]
        assert receiver.server_names and set(receiver.server_names) == {"receiver.test"}
    finally:
        receiver.close()
