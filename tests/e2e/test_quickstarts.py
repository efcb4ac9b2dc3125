"""Both provider quickstarts from ../shared/seeds, as written — only host, key and model changed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.e2e.conftest import LocalStack

HERE = Path(__file__).parent / "quickstarts"
SEEDS = Path(__file__).resolve().parents[3] / "shared" / "seeds"
HOST = "http://127.0.0.1:8000"


def _prepare(tmp_path: Path, stack: LocalStack, script: str, jsonl: str, as_name: str) -> Path:
    host = stack.base_url.removesuffix("/v1")
    (tmp_path / script).write_text((HERE / script).read_text().replace(HOST, host))
    shutil.copy(HERE / jsonl, tmp_path / as_name)
    return tmp_path / script


@pytest.mark.e2e
def test_openai_sdk_quickstart_as_written(local_stack: LocalStack, tmp_path: Path) -> None:
    script = _prepare(tmp_path, local_stack, "deepinfra_openai_sdk.py", "deepinfra_batch_input.jsonl",
                      "batch_input.jsonl")
    env = {**os.environ, "DEEPINFRA_TOKEN": local_stack.api_key}
    out = subprocess.run([sys.executable, script.name], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("Uploaded input file: file-") and lines[1].startswith("Created batch: batch_")
    answers = {ln.split(":", 1)[0]: ln.split(":", 1)[1] for ln in lines if ln.startswith("request-")}
    assert set(answers) == {"request-0", "request-1"} and all(a.strip() for a in answers.values())


@pytest.mark.e2e
def test_requests_quickstart_as_written(local_stack: LocalStack, tmp_path: Path) -> None:
    upload = _prepare(tmp_path, local_stack, "cheapestinference_upload_and_create.py",
                      "cheapestinference_batch_requests.jsonl", "batch_requests.jsonl")
    check = _prepare(tmp_path, local_stack, "cheapestinference_status_and_results.py",
                     "cheapestinference_batch_requests.jsonl", "batch_requests.jsonl")
    # The guide's steps run in one namespace; a user waits between "Create" and "Check status".
    driver = textwrap.dedent(f"""
        import time, requests
        ns = {{}}
        exec(open({str(upload)!r}).read(), ns)
        while True:
            s = requests.get("{local_stack.base_url}/batches/" + ns["batch"]["id"], headers=ns["headers"]).json()
            if s["status"] in ("completed", "failed", "expired", "cancelled"):
                break
            time.sleep(2)
        exec(open({str(check)!r}).read(), ns)
    """)
    env = {**os.environ, "CHEAPESTINFERENCE_API_KEY": local_stack.api_key}
    out = subprocess.run([sys.executable, "-c", driver], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Status: completed" in out.stdout and "Progress: 2/2" in out.stdout
    answers = [ln for ln in out.stdout.splitlines() if ln.startswith("request-")]
    assert sorted(a.split(":")[0] for a in answers) == ["request-1", "request-2"]


@pytest.mark.skipif(not SEEDS.exists(), reason="../shared/seeds is not beside this checkout")
def test_quickstart_copies_differ_from_the_seeds_only_in_host_key_and_model() -> None:
    deepinfra = (SEEDS / "deepinfra-batch-announcement.txt").read_text()
    cheapest = (SEEDS / "cheapestinference-batch-quickstart.txt").read_text()
    code = (HERE / "deepinfra_openai_sdk.py").read_text().replace(HOST + "/v1", "https://api.deepinfra.com/v1/openai")
    assert code.strip() in deepinfra
    for line in (HERE / "deepinfra_batch_input.jsonl").read_text().splitlines():
        assert line.replace("SmolLM2-135M-Instruct", "meta-llama/Meta-Llama-3.1-8B-Instruct") in deepinfra
    for name in ("cheapestinference_upload_and_create.py", "cheapestinference_status_and_results.py"):
        for block in (HERE / name).read_text().replace(HOST, "https://api.cheapestinference.ai").split("\n\n\n"):
            assert block.strip() in cheapest, block
    for line in (HERE / "cheapestinference_batch_requests.jsonl").read_text().splitlines():
        assert line.replace("SmolLM2-135M-Instruct", "meta-llama/Meta-Llama-3.1-70B-Instruct-Turbo") in cheapest
