"""A real stack for the Uploads tests: moto's server and the API under uvicorn, both on loopback."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest
import uvicorn
from moto.server import ThreadedMotoServer

from functions.api.app import create_app
from nightbatch.aws import make_adapters
from nightbatch.aws.dynamo import create_table
from nightbatch.local.aws import FAKE_CREDENTIALS, free_port
from nightbatch.local.runner import LocalWorkflow
from nightbatch.local.stack import local_settings
from nightbatch.settings import SETTINGS
from nightbatch.wiring import build_services
from tests.files.stack import API_KEY, Stack


@pytest.fixture(scope="session")
def aws_endpoint() -> Iterator[str]:
    saved = {k: os.environ.get(k) for k in FAKE_CREDENTIALS}
    os.environ.update(FAKE_CREDENTIALS)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="session")
def stack(aws_endpoint: str) -> Iterator[Stack]:
    settings = local_settings(
        api_key=API_KEY,
        bucket="nb-uploads-test",
        table="nb-uploads-test",
        upload_parts_grace_seconds=0,
    )
    adapters = make_adapters(settings, endpoint_url=aws_endpoint)
    adapters.client("s3").create_bucket(Bucket=settings.deployment.bucket)
    create_table(adapters.client("dynamodb"), settings.deployment.table)
    workflow = LocalWorkflow(adapters, engines=False)
    services = build_services(adapters, workflow)
    workflow.bind(services)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(lambda: services),
            host="127.0.0.1",
            port=port,
            log_level="warning",
            lifespan="off",
        )
    )
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    stack = Stack(
        base_url=f"http://127.0.0.1:{port}/v1",
        aws_endpoint=aws_endpoint,
        services=services,
        settings=settings,
    )
    try:
        yield stack
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        stack.jobs.stop()
        workflow.stop()


@pytest.fixture
def override(stack: Stack) -> Iterator[Callable[..., None]]:
    """Changes settings of the running stack for one test (the services read them on every request)."""
    saved: dict[str, Any] = {}

    def apply(**values: Any) -> None:
        for k, v in values.items():
            saved.setdefault(k, SETTINGS[k].get(stack.settings))
            SETTINGS[k].set(stack.settings, v)

    try:
        yield apply
    finally:
        stack.jobs.drain()
        for k, v in saved.items():
            SETTINGS[k].set(stack.settings, v)


@pytest.fixture
def client(stack: Stack) -> Iterator[openai.OpenAI]:
    with contextlib.closing(stack.client()) as c:
        yield c
