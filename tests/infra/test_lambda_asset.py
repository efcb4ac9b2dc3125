"""The Lambda asset, built as infra/bundling.py builds it (for this machine's platform and Python), runs alone.

A clean interpreter (`python -I -S`: no site-packages, no PYTHONPATH, nothing from the dev venv) with only the
asset on sys.path imports every handler the synthesized template names and answers one real event with each,
against moto's server: the API through Mangum with API Gateway HTTP API v2 events (a file upload, a batch
create), the workflow's tasks with the payload the state machine passes them, the sweeper with its schedule's,
the queue consumers with an SQS batch.
"""

from __future__ import annotations

import base64
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import boto3
import pytest

from infra.bundling import PipLocalBundler, lambda_requirements
from tests.conftest import FAKE_AWS_ENV, MotoServer
from tests.infra.moto_workflow import create_resources
from tests.infra.synth import ROOT

BUDGET_BYTES = 50 * 1024 * 1024
BASE_PYTHON = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
DRIVER = Path(__file__).with_name("asset_driver.py")
MODEL = "Qwen2.5-7B-Instruct"

pytestmark = pytest.mark.slow


def _pip_platform() -> str:
    return {"x86_64": "manylinux2014_x86_64", "aarch64": "manylinux2014_aarch64"}[platform.machine()]


@pytest.fixture(scope="session")
def asset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundle, once per session: pip for this machine's platform and Python, then the code."""
    out = tmp_path_factory.mktemp("lambda-asset")
    bundler = PipLocalBundler(root=ROOT, requirements=lambda_requirements(ROOT / "pyproject.toml"),
                              python_version=f"{sys.version_info.major}.{sys.version_info.minor}",
                              platform=_pip_platform())
    assert bundler.try_bundle(str(out))
    return out


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", **FAKE_AWS_ENV}
    return {**env, **(extra or {})}


def test_asset_fits_the_budget_and_holds_no_local_only_package(asset: Path) -> None:
    size = _size(asset)
    print(f"\nLambda asset: {size / 1e6:.1f} MB unzipped ({len(list(asset.rglob('*')))} entries)")
    assert size <= BUDGET_BYTES
    top = {p.name.split("-")[0].lower() for p in asset.iterdir()}
    assert not top & {"moto", "uvicorn", "openai", "psutil", "vllm", "torch", "aws_cdk", "gpu_worker", "infra"}
    assert {"fastapi", "mangum", "boto3", "pydantic", "nightbatch", "functions"} <= top


def test_api_handler_cold_import(asset: Path) -> None:
    command = [str(BASE_PYTHON), "-I", "-S", "-X", "importtime", "-c",
               f"import sys; sys.path.insert(0, {str(asset)!r}); import functions.api.handler"]
    started = time.perf_counter()
    result = subprocess.run(command, env=_clean_env({"AWS_ENDPOINT_URL": "http://127.0.0.1:9"}),
                            capture_output=True, text=True, timeout=120)
    wall = time.perf_counter() - started
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line.split("|") for line in result.stderr.splitlines() if line.startswith("import time:")]
    cumulative = {row[2].strip(): int(row[1]) for row in rows[1:] if len(row) == 3}
    total_us = cumulative["functions.api.handler"]
    heaviest = sorted(((us, name) for name, us in cumulative.items() if "." not in name.strip()), reverse=True)[:5]
    print(f"\nAPI handler cold import: {total_us / 1e3:.0f} ms of imports, {wall:.2f} s wall with interpreter start; "
          f"heaviest top-level: {', '.join(f'{n} {us / 1e3:.0f} ms' for us, n in heaviest)}")
    assert total_us < 10_000_000


def _http_event(method: str, path: str, key: str, body: bytes, content_type: str, *, b64: bool) -> dict[str, Any]:
    return {
        "version": "2.0", "routeKey": "$default", "rawPath": path, "rawQueryString": "",
        "headers": {"authorization": f"Bearer {key}", "content-type": content_type, "host": "api.example.com",
                    "content-length": str(len(body))},
        "requestContext": {"http": {"method": method, "path": path, "protocol": "HTTP/1.1", "sourceIp": "127.0.0.1",
                                    "userAgent": "asset-test"}, "requestId": "r", "routeKey": "$default",
                           "stage": "$default", "accountId": "123456789012", "apiId": "api", "domainName":
                           "api.example.com", "domainPrefix": "api", "time": "01/Jan/2026:00:00:00 +0000",
                           "timeEpoch": 0},
        "body": base64.b64encode(body).decode() if b64 else body.decode(), "isBase64Encoded": b64,
    }


def _multipart(payload: bytes) -> tuple[bytes, str]:
    boundary = "assetboundary"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n"
            f"Content-Type: application/octet-stream\r\n\r\n").encode() + payload + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


def _run(asset: Path, calls: list[dict[str, Any]], env: dict[str, str], tmp_path: Path) -> list[dict[str, Any]]:
    spec = tmp_path / "calls.json"
    spec.write_text(json.dumps(calls))
    result = subprocess.run([str(BASE_PYTHON), "-I", "-S", str(DRIVER), str(asset), str(spec)],
                            env=_clean_env(env), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    # The handlers' own JSON log lines go to stdout too; the driver's lines are the ones it names.
    parsed = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return [p for p in parsed if "handler" in p or "foreign_modules" in p]


def test_every_handler_in_the_template_answers_from_the_asset_alone(
        asset: Path, template: dict[str, Any], moto_server: MotoServer, tmp_path: Path) -> None:
    d = create_resources(template)  # against moto's server: AWS_ENDPOINT_URL is set for the session
    endpoint = {"AWS_ENDPOINT_URL": moto_server.endpoint_url}
    api_handler = "functions.api.handler.handler"
    api_env = d.lambda_env[api_handler]
    key = boto3.client("secretsmanager").get_secret_value(
        SecretId=api_env["NIGHTBATCH_API_KEYS_SECRET"])["SecretString"].split(",")[0]

    line = {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}}
    body, content_type = _multipart(json.dumps(line).encode() + b"\n")
    upload, _ = _run(asset, [{"handler": api_handler, "env": api_env,
                             "event": _http_event("POST", "/v1/files", key, body, content_type, b64=True)}],
                    endpoint, tmp_path)
    assert upload["result"]["statusCode"] == 200, upload
    file_id = json.loads(upload["result"]["body"])["id"]
    create = json.dumps({"input_file_id": file_id, "endpoint": "/v1/chat/completions",
                         "completion_window": "24h"}).encode()
    created, _ = _run(asset, [{"handler": api_handler, "env": api_env,
                              "event": _http_event("POST", "/v1/batches", key, create, "application/json", b64=False)}],
                     endpoint, tmp_path)
    assert created["result"]["statusCode"] == 200, created
    batch_id = json.loads(created["result"]["body"])["id"]

    # The payloads the template's state machine, schedule and queues send.
    step = {"version": 1, "batch_id": batch_id}
    events: dict[str, Any] = {
        "functions.tasks.validate.handler": step, "functions.tasks.plan.handler": step,
        "functions.tasks.finalize.handler": step, "functions.tasks.notify.handler": step,
        "functions.tasks.sweep.handler": {"version": 1},
        "functions.tasks.deliver.handler": {"Records": []},
        "functions.tasks.compose_upload.handler": {"Records": []},
    }
    assert set(d.handlers.values()) == {api_handler, *events}, "a handler in the template is not driven here"
    calls = [{"handler": h, "env": d.lambda_env[h], "event": event} for h, event in events.items()]
    # Then the batch as the API reports it: no worker ran, so its one line ends shard_failed.
    calls.append({"handler": api_handler, "env": api_env,
                  "event": _http_event("GET", f"/v1/batches/{batch_id}", key, b"", "application/json", b64=False)})
    *answers, retrieved, modules = _run(asset, calls, endpoint, tmp_path)
    assert modules["foreign_modules"] == []
    assert all("error" not in a for a in answers), [a for a in answers if "error" in a]
    by_handler = {a["handler"]: a["result"] for a in answers}
    assert by_handler["functions.tasks.validate.handler"]["valid"] is True
    assert by_handler["functions.tasks.plan.handler"]["shard_count"] == 1
    assert by_handler["functions.tasks.deliver.handler"] == {"batchItemFailures": []}
    batch = json.loads(retrieved["result"]["body"])
    assert batch["status"] == "completed", batch
    assert batch["request_counts"] == {"total": 1, "completed": 0, "failed": 1}
