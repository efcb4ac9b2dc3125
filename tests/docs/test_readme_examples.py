"""The README's two Python examples run as written against the local API: the real app over HTTP on moto, the
local workflow with its engines off (every line ends `shard_failed`, so the examples take the error branch), the
key the README starts `make run` with. Only the host (a free port, not 8000) and the poll interval change."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nightbatch.aws import Adapters
from tests.support.tenant_stack import Stack, start_stack, stop_stack, tenancy_settings

README = Path(__file__).resolve().parents[2] / "README.md"
HOST = "http://127.0.0.1:8000"


def _example(heading: str) -> str:
    """The first ```python block under `## heading`."""
    section = README.read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```python\n(.*?)```", section, flags=re.S)
    assert block is not None, f"no Python example under '{heading}'"
    return block.group(1)


@pytest.fixture
def local_api(fresh_aws: Callable[..., Adapters]) -> Iterator[Stack]:
    key = re.search(r"NIGHTBATCH_API_KEY=(\S+) make run", README.read_text())
    assert key is not None, "the README says which key `make run` is started with"
    stack = start_stack(fresh_aws(**tenancy_settings(api_key=key.group(1))), "local")
    yield stack
    stop_stack(stack)


def _run(code: str, stack: Stack, cwd: Path) -> str:
    assert HOST in code and "time.sleep(5)" in code
    code = code.replace(HOST, stack.base_url.removesuffix("/v1")).replace("time.sleep(5)", "time.sleep(0.2)")
    out = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_the_openai_example_runs_as_written(local_api: Stack, tmp_path: Path) -> None:
    out = _run(_example("Use it with the OpenAI SDK"), local_api, tmp_path)
    assert out.startswith("completed ") and "total=1" in out, out
    assert '"custom_id":"q1"' in out and "shard_failed" in out, out


def test_the_anthropic_example_runs_as_written(local_api: Stack, tmp_path: Path) -> None:
    out = _run(_example("Or with the Anthropic SDK"), local_api, tmp_path)
    assert out.split() == ["q1", "errored"], out
