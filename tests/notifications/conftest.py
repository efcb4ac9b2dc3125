"""Fixtures for the notification tests: the shared API server pointed at a notification-ready stack, loopback
webhook receivers, and a guard that fails any test whose code tries to connect anywhere but loopback."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from moto.core.models import DEFAULT_ACCOUNT_ID

from nightbatch.wiring import build_notifier
from tests.conftest import REGION, ApiServer, MotoServer, _ApiHost
from tests.notifications.support import SENDER, ConnectionGuard, Receiver, Stack, is_loopback


@pytest.fixture(autouse=True)
def connection_guard(monkeypatch: pytest.MonkeyPatch) -> Iterator[ConnectionGuard]:
    """Refuses (and records) every connection to a non-loopback address; a test that made one fails."""
    guard = ConnectionGuard()
    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex

    def connect(self: socket.socket, address: Any) -> None:
        if not is_loopback(address):
            guard.attempts.append(address)
            raise ConnectionRefusedError(f"test guard: no traffic to {address!r}")
        real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        if not is_loopback(address):
            guard.attempts.append(address)
            raise ConnectionRefusedError(f"test guard: no traffic to {address!r}")
        return real_connect_ex(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    yield guard
    assert not guard.attempts, f"the code tried to connect to non-loopback addresses: {guard.attempts}"


@pytest.fixture
def make_stack(
    serve_api: Callable[..., ApiServer], _api_host: _ApiHost, moto_server: MotoServer
) -> Iterator[Callable[..., Stack]]:
    """A fresh bucket, table and topic, a verified sender, the API on them, and a notifier with its own queue.

    Local mode (in-process delivery queue, loopback receivers allowed) with delays shrunk to fractions of a
    second; keyword arguments override Settings."""
    made: list[Stack] = []

    def make(**overrides: Any) -> Stack:
        topic = f"nb-notify-{uuid.uuid4().hex[:12]}"
        values: dict[str, Any] = {
            "mode": "local", "allow_private_targets": True,
            "topic_arn": f"arn:aws:sns:{REGION}:{DEFAULT_ACCOUNT_ID}:{topic}",
            "webhook_retry_base_seconds": 0.3, "webhook_retry_max_delay_seconds": 2.0,
            "webhook_max_age_seconds": 30.0, "webhook_timeout_seconds": 3.0,
            "email_sender": SENDER, "email_allowed_domains": "example.com", "email_recipients": "ops@example.org",
            "link_secret": "test-link-secret", "public_base_url": f"http://127.0.0.1:{_api_host.port}",
        }
        values.update(overrides)
        api = serve_api(**values)
        adapters = api.services.adapters
        if "topic_arn" not in overrides:
            adapters.sns.create_topic(Name=topic)
        adapters.client("ses").verify_domain_identity(Domain=SENDER.split("@")[1])
        stack = Stack(api=api, notifier=build_notifier(adapters), moto_url=moto_server.endpoint_url)
        made.append(stack)
        return stack

    yield make
    for s in made:
        s.notifier.close()


@pytest.fixture
def stack(make_stack: Callable[..., Stack]) -> Stack:
    return make_stack()


@pytest.fixture
def receiver_factory() -> Iterator[Callable[..., Receiver]]:
    made: list[Receiver] = []

    def make(script: list[Any] | None = None) -> Receiver:
        r = Receiver(script)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()
