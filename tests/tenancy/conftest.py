"""Fixtures for the tenancy tests: moto's server on loopback, and the real app served by uvicorn per test.

Each stack gets its own table and bucket on one shared moto server, so tests stay independent and fast.
"""

from __future__ import annotations

import io
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvicorn
from moto.server import ThreadedMotoServer
from openai import OpenAI

from functions.api.app import create_app
from nightbatch.keys import KeyStore
from nightbatch.local.runner import LocalWorkflow
from nightbatch.services import Services, build_services
from nightbatch.settings import Settings
from nightbatch.storage import make_adapters
from nightbatch.storage.dynamo import create_table

BOOTSTRAP_KEY = "nb-bootstrap-test-key-0000000000000000"
MODEL = "SmolLM2-135M-Instruct"
SHARED_BUCKET = "nightbatch-tenancy-tests"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL")}
    os.environ["AWS_ACCESS_KEY_ID"] = "testing"
    os.environ["AWS_SECRET_ACCESS_KEY"] = "testing"
    os.environ.pop("AWS_ENDPOINT_URL", None)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's server logs every request at INFO
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


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


def start_stack(moto_endpoint: str, workflow: str = "recording", own_bucket: bool = False,
                **overrides: Any) -> Stack:
    """A fresh table (and the shared bucket), the app on uvicorn on a free loopback port."""
    name = f"nb-{uuid.uuid4().hex[:12]}"
    # Object keys are unique ids, so stacks may share a bucket (creating one costs moto ~0.5 s).
    bucket = name if own_bucket else SHARED_BUCKET
    values: dict[str, Any] = {"mode": "local", "table": name, "bucket": bucket, "region": "us-east-1",
                              "api_key": BOOTSTRAP_KEY, "key_cache_seconds": 0}
    values.update(overrides)
    settings = Settings(**values)
    adapters = make_adapters(settings, endpoint_url=moto_endpoint)
    s3 = adapters.client("s3")
    if own_bucket or SHARED_BUCKET not in {b["Name"] for b in s3.list_buckets().get("Buckets", [])}:
        s3.create_bucket(Bucket=bucket)
    create_table(adapters.client("dynamodb"), name)
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
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    return Stack(settings=settings, services=services, base_url=f"http://127.0.0.1:{port}/v1",
                 counter=counter, server=server, thread=thread, workflow=wf)


def stop_stack(stack: Stack) -> None:
    stack.server.should_exit = True
    stack.thread.join(timeout=5)
    if isinstance(stack.workflow, LocalWorkflow):
        stack.workflow.stop()


@pytest.fixture
def make_stack(moto_endpoint: str) -> Iterator[Callable[..., Stack]]:
    stacks: list[Stack] = []

    def make(workflow: str = "recording", own_bucket: bool = False, **overrides: Any) -> Stack:
        stack = start_stack(moto_endpoint, workflow, own_bucket, **overrides)
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


def wait_for(predicate: Callable[[], Any], timeout: float = 20.0, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(interval)
