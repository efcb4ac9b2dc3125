"""A live nightbatch API on loopback (uvicorn + moto's server) for the CLI, run as a user runs it."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from functions.api.app import create_app
from nightbatch import lifecycle
from nightbatch.local.aws import free_port, start_embedded_aws
from nightbatch.local.stack import local_settings
from nightbatch.services import Services, build_services
from nightbatch.storage import make_adapters

API_KEY = "nb-test-cli"


class HandDrivenWorkflow:
    """Execution is not under test here: batches stay where they are until the test moves them."""

    def start(self, batch_id: str) -> None:
        pass


@dataclass
class LiveApi:
    url: str  # http://127.0.0.1:port (the API at /v1)
    api_key: str
    services: Services

    def drive(self, batch_id: str, *steps: str, **extra: Any) -> dict[str, Any]:
        """Moves a batch through `steps` of the lifecycle, skipping those it has reached (the runner may move
        it too); `extra` fields are written with the last step."""
        table = self.services.adapters.table
        item = table.get(batch_id) or {}
        for i, step in enumerate(steps):
            last = i == len(steps) - 1
            if item.get("status") != step:
                item = lifecycle.transition(table, batch_id, step, extra=extra if last else None)
            elif last and extra:
                item = table.update(batch_id, set_=extra)
        return item


def serve_in_thread(app: Any) -> tuple[uvicorn.Server, threading.Thread, str]:
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    return server, thread, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def live_api() -> Iterator[LiveApi]:
    saved_env = dict(os.environ)  # the embedded AWS points this process's boto3 at itself; undo that after
    # moto keeps one in-process state for every server it starts: fresh names per module.
    name = f"nb-cli-{secrets.token_hex(4)}"
    settings = local_settings(api_key=API_KEY, bucket=name, table=name)
    aws = start_embedded_aws(settings)
    adapters = make_adapters(settings, endpoint_url=aws.endpoint_url)
    services = build_services(adapters, HandDrivenWorkflow())
    server, thread, url = serve_in_thread(create_app(lambda: services))
    try:
        yield LiveApi(url=url, api_key=API_KEY, services=services)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        aws.stop()
        os.environ.clear()
        os.environ.update(saved_env)


ROOT = Path(__file__).resolve().parents[2]


@dataclass
class CliRun:
    code: int
    out: str
    err: str


class Cli:
    """Runs `python -m nightbatch …` in a child process, with the environment a user would export."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "nightbatch", *args]

    def __call__(self, *args: str, env: dict[str, str] | None = None, timeout: float = 60) -> CliRun:
        done = subprocess.run(self.command(*args), env={**self.env, **(env or {})}, capture_output=True,
                              text=True, timeout=timeout, cwd=ROOT)
        return CliRun(done.returncode, done.stdout, done.stderr)

    def start(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(self.command(*args), env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=ROOT)


@pytest.fixture
def cli(live_api: LiveApi, tmp_path: Path) -> Cli:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NIGHTBATCH_", "AWS_", "MOTO_"))}
    env.update({
        "PYTHONPATH": str(ROOT),
        "XDG_STATE_HOME": str(tmp_path / "state"),  # never a `nightbatch local` of whoever runs the tests
        "NIGHTBATCH_BASE_URL": f"{live_api.url}/v1",
        "NIGHTBATCH_API_KEY": live_api.api_key,
    })
    return Cli(env)
