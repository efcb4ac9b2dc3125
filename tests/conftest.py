"""Shared fixtures: moto's server as AWS, the API app over real HTTP, OpenAI SDK clients, small factories.

AWS is moto everywhere. One ThreadedMotoServer serves the whole session, but every test gets its own bucket
and table: moto's server runs in this process and shares moto's global backends, which any `mock_aws` test
resets on entry and exit, so nothing may be created once and relied on across tests.

The API runs in one uvicorn server per session; `serve_api(...)` points it at fresh services (new bucket and
table, the test's settings) for each test, so a test never sees another test's files or batches.
"""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from openai import OpenAI

from functions.api.app import create_app
from nightbatch.aws import Adapters, make_adapters
from nightbatch.aws.dynamo import create_table
from nightbatch.local.aws import AtomicMotoServer
from nightbatch.settings import Settings
from nightbatch.wiring import Services, build_services
from tests.support.local_stack import local_stack  # noqa: F401  (the session's one `nightbatch local`)
from tests.support.node import use_project_node
from tests.support.tenant_stack import make_stack, moto_endpoint  # noqa: F401  (the API served to several tenants)
from tests.support.threaded_uvicorn import serving

use_project_node()  # before any test module imports aws_cdk

TEST_API_KEY = "nb-test-key"
REGION = "us-east-1"
FAKE_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_SECURITY_TOKEN": "testing",
    "AWS_DEFAULT_REGION": REGION,
    "AWS_REGION": REGION,
}


# ---------------------------------------------------------------------------------------------- AWS (moto)


@dataclass(frozen=True)
class MotoServer:
    endpoint_url: str
    port: int


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoServer]:
    """moto's server on a free loopback port, with fake credentials and AWS_ENDPOINT_URL in the environment
    (so subprocesses and code that builds its own boto3 clients reach it too).

    It is the local stack's AtomicMotoServer: a ThreadedMotoServer whose DynamoDB requests are atomic as in
    AWS, so races between conditional writes behave as they will in production."""
    # One log line per AWS call would bury the interesting part of a failure report.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = AtomicMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    with pytest.MonkeyPatch.context() as mp:
        for k, v in FAKE_AWS_ENV.items():
            mp.setenv(k, v)
        mp.setenv("AWS_ENDPOINT_URL", endpoint)
        yield MotoServer(endpoint_url=endpoint, port=port)
    server.stop()


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def settings_for_test(**overrides: Any) -> Settings:
    """Settings for tests: the test key, a fresh bucket and table name; overrides win."""
    values: dict[str, Any] = {
        "region": REGION,
        "api_key": TEST_API_KEY,
        "bucket": unique_name("nb-test"),
        "table": unique_name("nb-test"),
    }
    values.update(overrides)
    return Settings.from_names(values)


@pytest.fixture(scope="session")
def _boto_session(moto_server: MotoServer) -> Any:
    # One session for the whole run: each new session re-reads and parses botocore's service models.
    return make_adapters(settings_for_test(), endpoint_url=moto_server.endpoint_url).session


@pytest.fixture
def fresh_aws(moto_server: MotoServer, _boto_session: Any) -> Iterator[Callable[..., Adapters]]:
    """Factory: Adapters over a NEW bucket and table on the shared moto server; kwargs override Settings."""
    made: list[Adapters] = []

    def make(**overrides: Any) -> Adapters:
        adapters = Adapters(
            settings=settings_for_test(**overrides),
            session=_boto_session,
            endpoint_url=moto_server.endpoint_url,
        )
        adapters.blobs.client.create_bucket(Bucket=adapters.settings.deployment.bucket)
        create_table(adapters.client("dynamodb"), adapters.settings.deployment.table)
        _ = adapters.table  # built here, not lazily in a server thread: boto3 sessions aren't thread-safe
        made.append(adapters)
        return adapters

    yield make
    for adapters in made:
        # Frees moto's memory; a `mock_aws` test may already have reset everything, hence the broad except.
        with contextlib.suppress(Exception):
            adapters.client("dynamodb").delete_table(TableName=adapters.settings.deployment.table)


@pytest.fixture
def adapters(fresh_aws: Callable[..., Adapters]) -> Adapters:
    return fresh_aws()


# ------------------------------------------------------------------------------------------ workflow port


class RecordingWorkflow:
    """The workflow port's test implementation: records the batch ids it is asked to start, runs nothing.

    Batches created through it stay `validating` until a test moves them (execution is another issue)."""

    def __init__(self) -> None:
        self.started: list[str] = []

    def start(self, batch_id: str) -> None:
        self.started.append(batch_id)


@pytest.fixture
def workflow() -> RecordingWorkflow:
    return RecordingWorkflow()


@pytest.fixture
def services(adapters: Adapters, workflow: RecordingWorkflow) -> Services:
    return build_services(adapters, workflow)


# ------------------------------------------------------------------------------------- API over real HTTP


@dataclass(frozen=True)
class SeenRequest:
    method: str
    path: str
    query: str
    headers: dict[str, str]


class RequestLog:
    """ASGI wrapper recording every request that reaches the server (method, path, headers).

    Tests use it to prove what the SDK sent, e.g. that a 409 was not retried."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.requests: list[SeenRequest] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.requests.append(
                SeenRequest(
                    method=scope["method"],
                    path=scope["path"],
                    query=scope.get("query_string", b"").decode(),
                    headers={k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])},
                )
            )
        await self.app(scope, receive, send)


@dataclass
class _ApiHost:
    """The session's one uvicorn server; `services` is swapped per test by `serve_api`."""

    port: int
    log: RequestLog
    services: Services | None = None


@dataclass
class ApiServer:
    base_url: str  # http://127.0.0.1:<port> (no /v1)
    services: Services
    workflow: RecordingWorkflow
    log: RequestLog
    api_key: str = TEST_API_KEY
    seen_from: int = field(default=0)

    @property
    def v1(self) -> str:
        return f"{self.base_url}/v1"

    @property
    def settings(self) -> Settings:
        return self.services.settings

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    @property
    def requests(self) -> list[SeenRequest]:
        """Requests that reached the server during this test."""
        return self.log.requests[self.seen_from :]

    def openai(self, **kw: Any) -> OpenAI:
        kw.setdefault("api_key", self.api_key)
        kw.setdefault("max_retries", 0)
        return OpenAI(base_url=self.v1, **kw)


@pytest.fixture(scope="session")
def _api_host() -> Iterator[_ApiHost]:
    holder: dict[str, _ApiHost] = {}

    def current_services() -> Services:
        services = holder["host"].services
        if services is None:
            raise RuntimeError("no test is using the API server right now")
        return services

    log = RequestLog(create_app(current_services))
    with serving(log, name="uvicorn-tests") as port:
        holder["host"] = _ApiHost(port=port, log=log)
        yield holder["host"]


@pytest.fixture
def serve_api(_api_host: _ApiHost, fresh_aws: Callable[..., Adapters]) -> Iterator[Callable[..., ApiServer]]:
    """Factory: points the session's API server at fresh services built with these Settings overrides."""

    def serve(**settings_overrides: Any) -> ApiServer:
        workflow = RecordingWorkflow()
        services = build_services(fresh_aws(**settings_overrides), workflow)
        _api_host.services = services
        return ApiServer(
            base_url=f"http://127.0.0.1:{_api_host.port}",
            services=services,
            workflow=workflow,
            log=_api_host.log,
            seen_from=len(_api_host.log.requests),
        )

    yield serve
    _api_host.services = None


@pytest.fixture
def api_server(serve_api: Callable[..., ApiServer]) -> ApiServer:
    """The API over real HTTP on loopback, backed by moto, with a RecordingWorkflow (default settings)."""
    return serve_api()


@pytest.fixture
def openai_client(api_server: ApiServer) -> Iterator[OpenAI]:
    """The stock OpenAI SDK pointed at the test server; no retries, so a failure shows at once."""
    client = api_server.openai()
    yield client
    client.close()


# ------------------------------------------------------------------------------------------------ factories


def batch_line(
    i: int, *, endpoint: str = "/v1/chat/completions", model: str = "SmolLM2-135M-Instruct"
) -> dict[str, Any]:
    if endpoint == "/v1/embeddings":
        body: dict[str, Any] = {"model": model, "input": f"sentence {i}"}
    elif endpoint == "/v1/completions":
        body = {"model": model, "prompt": f"Say {i}", "max_tokens": 8}
    elif endpoint == "/v1/responses":
        body = {"model": model, "input": f"Say {i}", "max_output_tokens": 8}
    else:
        body = {"model": model, "messages": [{"role": "user", "content": f"Say {i}"}], "max_tokens": 8}
    return {"custom_id": f"request-{i}", "method": "POST", "url": endpoint, "body": body}


def make_jsonl(n: int = 2, **kw: Any) -> bytes:
    """A valid batch input file of n requests (`request-0` … `request-{n-1}`)."""
    return b"".join(json.dumps(batch_line(i, **kw)).encode() + b"\n" for i in range(n))


@pytest.fixture(name="make_jsonl")
def make_jsonl_fixture() -> Callable[..., bytes]:
    return make_jsonl
