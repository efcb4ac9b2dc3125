"""The core flow once more with an openai 1.x release (1.109.1), in a small venv of its own.

The venv is built once under the user's cache directory and reused; the test skips only when pip cannot
reach the package registry.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from nightbatch.batches import lifecycle

if TYPE_CHECKING:
    from tests.conftest import ApiServer

OPENAI_V1 = "1.109.1"
SCRIPT = Path(__file__).parent / "scripts" / "openai_v1_flow.py"
UNREACHABLE = (
    "No matching distribution found", "Could not find a version that satisfies", "NewConnectionError",
    "Max retries exceeded", "Temporary failure in name resolution", "Network is unreachable",
    "Connection refused", "ProxyError",
)


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "nightbatch-tests"


def has_openai(python: Path) -> bool:
    probe = f"import openai, sys; sys.exit(openai.__version__ != {OPENAI_V1!r})"
    return python.exists() and subprocess.run([str(python), "-c", probe], capture_output=True).returncode == 0


@pytest.fixture(scope="session")
def openai_v1_python() -> Path:
    venv = cache_dir() / f"openai-{OPENAI_V1}"
    python = venv / "bin" / "python"
    if has_openai(python):
        return python
    # Built beside the final path and renamed into place, so an interrupted build is never reused.
    building = venv.with_name(f"{venv.name}.building-{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    building.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(building)], check=True)
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(building / "bin" / "python"), "install", "--quiet",
         f"openai=={OPENAI_V1}"],
        capture_output=True, text=True, timeout=600,
    )
    if pip.returncode != 0:
        shutil.rmtree(building, ignore_errors=True)
        output = pip.stdout + pip.stderr
        if any(marker in output for marker in UNREACHABLE):
            pytest.skip(f"pip could not reach the package registry for openai=={OPENAI_V1}: {output[-300:]}")
        raise AssertionError(f"pip install openai=={OPENAI_V1} failed:\n{output}")
    shutil.rmtree(venv, ignore_errors=True)
    building.rename(venv)
    assert has_openai(python)
    return python


def test_core_flow_with_openai_1x(openai_v1_python: Path, api_server: ApiServer) -> None:
    # A batch that already completed, for the 409-without-retries check.
    sdk = api_server.openai()
    f = sdk.files.create(file=("done.jsonl", b"{}\n"), purpose="batch")
    done = sdk.batches.create(input_file_id=f.id, endpoint="/v1/embeddings", completion_window="24h")
    table = api_server.services.adapters.table
    for to in ("in_progress", "finalizing", "completed"):
        lifecycle.transition(table, done.id, to)
    before = len(api_server.requests)

    run = subprocess.run([str(openai_v1_python), str(SCRIPT), api_server.v1, api_server.api_key, done.id],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)

    assert out["version"] == OPENAI_V1
    assert out["file"]["object"] == "file" and out["file"]["status"] == "processed"
    assert len(out["listed"]) == 3 and len(set(out["listed"])) == 3  # auto-paged, each once, terminated
    assert out["retrieved"] == out["file"]["id"]
    assert out["content"].startswith('{"custom_id": "r1"')
    assert out["batch"]["status"] == "validating"
    assert out["batch"]["metadata"] is None
    assert out["batch"]["request_counts"] == {"completed": 0, "failed": 0, "total": 0}
    assert out["batch"]["expires_at"] == out["batch"]["created_at"] + 86400
    assert out["batch_retrieved"] == "validating"
    assert out["batch"]["id"] in out["batches_listed"] and len(out["batches_listed"]) == 2
    assert out["cancelled"] == "cancelling"
    assert out["not_found"] == 404
    assert out["conflict"]["status"] == 409
    assert out["conflict"]["body"]["message"] == "Cannot cancel a batch with status 'completed'."
    assert out["deleted"] is True

    sent = api_server.requests[before:]
    assert all(r.headers["user-agent"] == f"OpenAI/Python {OPENAI_V1}" for r in sent)
    assert len([r for r in sent if r.path == f"/v1/batches/{done.id}/cancel"]) == 1
