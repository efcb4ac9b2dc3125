"""Fixtures for the notification tests: moto's server and the API on loopback, loopback webhook receivers, and a
guard that fails any test whose code tries to connect anywhere but loopback."""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pytest
import uvicorn
from moto.server import ThreadedMotoServer
from notify_support import (
    API_KEY,
    REGION,
    SENDER,
    ConnectionGuard,
    NoWorkflow,
    Receiver,
    ServicesHolder,
    Stack,
    free_port,
    is_loopback,
)

from functions.api.app import create_app
from nightbatch.notifications import build_notifier
from nightbatch.services import build_services
from nightbatch.settings import Settings
from nightbatch.storage import Adapters
from nightbatch.storage.dynamo import create_table


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


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto server logs every request
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        os.environ.setdefault(k, "testing")
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture(scope="session")
def api_server() -> Iterator[tuple[str, ServicesHolder]]:
    """One uvicorn on loopback for the session; each test points it at its own services."""
    holder = ServicesHolder()
    port = free_port()
    config = uvicorn.Config(create_app(holder), host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}", holder
    server.should_exit = True
    thread.join(timeout=5)


@pytest.fixture(scope="session")
def boto_session() -> Any:
    """One boto3 session for all stacks: a new session reloads every service model (about a second per stack)."""
    return boto3.session.Session(region_name=REGION)


@pytest.fixture
def make_stack(
    moto_endpoint: str, api_server: tuple[str, ServicesHolder], boto_session: Any
) -> Iterator[Callable[..., Stack]]:
    """A fresh moto state (bucket, table, topic, verified sender), services and a notifier with its own queue."""
    api_url, holder = api_server
    made: list[Stack] = []

    def make(**overrides: Any) -> Stack:
        # Fresh names rather than a moto reset: a reset garbage-collects the whole process (~0.7 s).
        name = f"nb-notify-{secrets.token_hex(4)}"
        values: dict[str, Any] = {
            "mode": "local", "region": REGION, "bucket": name, "table": name, "api_key": API_KEY,
            "allow_private_targets": True, "webhook_retry_base_seconds": 0.3,
            "webhook_retry_max_delay_seconds": 2.0, "webhook_max_age_seconds": 30.0,
            "webhook_timeout_seconds": 3.0, "ses_sender": SENDER, "notify_email_domains": "example.com",
            "notify_email_recipients": "ops@example.org", "link_secret": "test-link-secret",
            "public_base_url": api_url,
        }
        values.update(overrides)
        settings = Settings(**values)
        adapters = Adapters(settings=settings, session=boto_session, endpoint_url=moto_endpoint)
        adapters.client("s3").create_bucket(Bucket=settings.bucket)
        create_table(adapters.client("dynamodb"), settings.table)
        adapters.client("ses").verify_domain_identity(Domain=SENDER.split("@")[1])
        if "topic_arn" not in overrides:
            arn = adapters.sns.create_topic(Name=name)["TopicArn"]
            settings = settings.model_copy(update={"topic_arn": arn})
            adapters = Adapters(settings=settings, session=boto_session, endpoint_url=moto_endpoint)
        services = build_services(adapters, NoWorkflow())
        holder.services = services
        stack = Stack(settings=settings, adapters=adapters, services=services, notifier=build_notifier(adapters),
                      api_url=api_url, moto_url=moto_endpoint)
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
