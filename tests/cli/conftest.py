"""The CLI run as a user runs it (a child process) against the shared API server on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.conftest import ApiServer

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
def cli(api_server: ApiServer, tmp_path: Path) -> Cli:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NIGHTBATCH_", "AWS_", "MOTO_"))}
    env.update({
        "PYTHONPATH": str(ROOT),
        "XDG_STATE_HOME": str(tmp_path / "state"),  # never a `nightbatch local` of whoever runs the tests
        "NIGHTBATCH_BASE_URL": api_server.v1,
        "NIGHTBATCH_API_KEY": api_server.api_key,
    })
    return Cli(env)
