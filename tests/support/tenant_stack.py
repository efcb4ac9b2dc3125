"""The real app served by uvicorn per test, over tests/conftest.py's moto, with several tenants' keys: `make_stack`
and `moto_endpoint` (fixtures tests/conftest.py offers every folder) and the helpers the tests beside them import.

Each stack has its own bucket and table, several tenants' keys in it, and either the recording workflow
(batches stay `validating`) or the local workflow with engines off (the real pipeline; every line fails).
"""

from __future__ import annotations

import io
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvicorn
from openai import OpenAI

from functions.api.app import create_app
from nightbatch.aws import Adapters, make_adapters
from nightbatch.aws.dynamo import create_table
from nightbatch.local.runner import LocalWorkflow
from nightbatch.settings import Settings
from nightbatch.tenancy.keys import KeyStore
from nightbatch.wiring import Services, build_services

BOOTSTRAP_KEY = "nb-bootstrap-test-key-0000000000000000"
MODEL = "SmolLM2-135M-Instruct"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def moto_endpoint(moto_server: Any) -> str:
    """The session's moto server from tests/conftest.py (DynamoDB requests atomic, as in AWS)."""
    return str(moto_server.endpoint_url)


class RecordingWorkflow:
    """The workflow port's test implementation (as in tests/workflow): batches stay `validating`."""

    def __init__(self) -> None:
        self.started: list[str] = []

    def start(self, batch_id: str) -> None:
        self.started.append(batch_id)


class HitCounter:
    """ASGI wrapper that records (method, path) of every request that reached the server."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.hits: list[tuple[str, str]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.hits.append((scope["method"], scope["path"]))
        await self.app(scope, receive, send)


@dataclass
class Stack:
    settings: Settings
    services: Services
    base_url: str
    counter: HitCounter
    server: Any
    thread: threading.Thread
    workflow: Any
    keys: list[str] = field(default_factory=list)

    @property
    def table(self) -> Any:
        return self.services.adapters.table

    def new_key(self, tenant: str, name: str | None = None) -> str:
        key, _ = KeyStore(self.table).create(name=name or f"k-{uuid.uuid4().hex[:8]}", tenant=tenant)
        return key

    def client(self, key: str, **kw: Any) -> OpenAI:
        kw.setdefault("max_retries", 0)
        return OpenAI(base_url=self.base_url, api_key=key, **kw)

    def hits(self, method: str, path: str) -> int:
        return sum(1 for m, p in self.counter.hits if m == method and p == path)


def tenancy_settings(**overrides: Any) -> dict[str, Any]:
    values: dict[str, Any] = {"mode": "local", "api_key": BOOTSTRAP_KEY, "key_cache_seconds": 0}
    values.update(overrides)
    return values


def fresh_adapters(moto_endpoint: str, **overrides: Any) -> Adapters:
    """A new bucket and table (for fixtures wider than one test, where tests/conftest.py's fresh_aws can't go)."""
    name = f"nb-{uuid.uuid4().hex[:12]}"
    settings = Settings.from_names({"region": "us-east-1", "table": name, "bucket": name,
                                    **tenancy_settings(**overrides)})
    adapters = make_adapters(settings, endpoint_url=moto_endpoint)
    adapters.client("s3").create_bucket(Bucket=name)
    create_table(adapters.client("dynamodb"), name)
    return adapters


def start_stack(adapters: Adapters, workflow: str = "recording") -> Stack:
    """The app on uvicorn on a free loopback port, over these adapters, with a recording or the local workflow."""
    _ = adapters.table  # built here, not lazily in a server thread: boto3 sessions aren't thread-safe
    wf: Any = LocalWorkflow(adapters, engines=False) if workflow == "local" else RecordingWorkflow()
    services = build_services(adapters, wf)
    if workflow == "local":
        wf.bind(services)
    counter = HitCounter(create_app(lambda: services))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(counter, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    return Stack(settings=adapters.settings, services=services, base_url=f"http://127.0.0.1:{port}/v1",
                 counter=counter, server=server, thread=thread, workflow=wf)


def stop_stack(stack: Stack) -> None:
    stack.server.should_exit = True
    stack.thread.join(timeout=5)
    if isinstance(stack.workflow, LocalWorkflow):
        stack.workflow.stop()


@pytest.fixture
def make_stack(fresh_aws: Callable[..., Adapters]) -> Iterator[Callable[..., Stack]]:
    """Factory: a fresh bucket and table (tests/conftest.py's fresh_aws) and the API over real HTTP on them."""
    stacks: list[Stack] = []

    def make(workflow: str = "recording", **overrides: Any) -> Stack:
        stack = start_stack(fresh_aws(**tenancy_settings(**overrides)), workflow)
        stacks.append(stack)
        return stack

    yield make
    for s in stacks:
        stop_stack(s)


def chat_lines(n: int, *, prefix: str = "req", model: str = MODEL, words: int = 3) -> bytes:
    out = io.BytesIO()
    for i in range(n):
        line = {"custom_id": f"{prefix}-{i}", "method": "POST", "url": "/v1/chat/completions",
                "body": {"model": model, "max_tokens": 16,
                         "messages": [{"role": "user", "content": " ".join(["hello"] * words)}]}}
        out.write(json.dumps(line).encode() + b"\n")
    return out.getvalue()


def wait_for(predicate: Callable[[], Any], timeout: float = 90.0, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(interval)
