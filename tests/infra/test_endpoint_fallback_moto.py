"""The deadline-aware fallback in the synthesized workflow on moto (the real state machine, the real handlers, the
worker's entry in-process): an endpoint shard whose measured pace cannot meet the window stops on the runner, Capacity
moves its remaining lines to the model's AWS Batch GPU path, and every line ends once across the two; the batch object
and the doctor say which backend ran what.

The endpoint is a real HTTP server in the test (slow: one second an answer, two at a time), on the port the template
names; the GPU path runs the deterministic engine, as every moto workflow test does."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

import nightbatch.clock
from nightbatch import layout
from nightbatch.batches.request import CreateBatchRequest
from nightbatch.cli.doctor.api import backends_detail
from nightbatch.shards.pace import read_pace
from nightbatch.wiring import Services, default_services
from tests.infra.conftest import ENDPOINT_MODEL, ENDPOINT_SECRET
from tests.infra.moto_workflow import REGION, Deployment, wait_for_execution, worker_in_process
from tests.infra.synth import Synth
from tests.infra.test_capacity_moto import Clock, jobs_of, read_file_of
from tests.infra.test_workflow_moto import _clear_caches, deploy_in_moto, execution_arn, jsonl
from tests.support.endpoints import fresh_endpoints  # noqa: F401  (the fixture)
from tests.support.scripted_server import Answer, Seen, chat_completion, scripted_server

ENGINE = "tests.support.deterministic_engine:DeterministicEngine"
KEY = "sk-moto-endpoint"
LINES = 40
# 1 h window with 1,805 s of it left: any pace short of finishing the shard in 5 s leaves less slack than the margin.
SECONDS_LEFT = 1805


def submit(lines: int) -> tuple[Services, str]:
    services = default_services()
    payload = jsonl([{"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions", "body": {
        "model": ENDPOINT_MODEL, "messages": [{"role": "user", "content": f"question {i}"}], "max_tokens": 8}}
        for i in range(1, lines + 1)])
    file = services.files.create("default", filename="in.jsonl", purpose="batch", fileobj=io.BytesIO(payload),
                                 size=len(payload))
    batch = services.batches.create("default", CreateBatchRequest(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="1h"))
    return services, batch.id


@pytest.fixture
def deployment(endpoint_synth: Synth, monkeypatch: pytest.MonkeyPatch) -> Iterator[Deployment]:
    yield from deploy_in_moto(endpoint_synth.template, monkeypatch)


pytestmark = pytest.mark.usefixtures("fresh_endpoints")


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    _clear_caches()
    yield
    _clear_caches()


def test_an_endpoint_too_slow_for_the_window_moves_its_remaining_lines_to_the_batch_gpus(
        deployment: Deployment, monkeypatch: pytest.MonkeyPatch, endpoint_port: int) -> None:
    clock = Clock()
    monkeypatch.setattr(nightbatch.clock, "time", clock)
    # The worker's own settings, quick for a test: the pace judged after a second, polled often, a short drain.
    for name, value in {"NIGHTBATCH_ENDPOINT_MEASURE_SECONDS": "1", "NIGHTBATCH_WORKER_POLL_SECONDS": "0.2",
                        "NIGHTBATCH_WORKER_DRAIN_SECONDS": "5", "NIGHTBATCH_ENDPOINT_MAX_CONCURRENCY": "2",
                        "NIGHTBATCH_ENDPOINT_METRICS_SECONDS": "0"}.items():
        monkeypatch.setenv(name, value)
    _clear_caches()
    boto3.client("secretsmanager", region_name=REGION).create_secret(Name=ENDPOINT_SECRET, SecretString=KEY)
    deployment.shard_runner = worker_in_process(monkeypatch, engine=ENGINE)
    seen: list[Seen] = []
    lock = threading.Lock()

    def slow(request: Seen) -> Answer:
        with lock:
            seen.append(request)
        body = request.body or {}
        return Answer(200, chat_completion(body, content="from the endpoint"), delay=1.0)

    with scripted_server(slow, port=endpoint_port):
        services, batch_id = submit(LINES)
        clock.offset = 3600 - SECONDS_LEFT
        assert wait_for_execution(execution_arn(deployment, batch_id))["status"] == "SUCCEEDED"
    jobs = jobs_of(deployment, batch_id)
    assert {j.shard_id for j in jobs} == {"00000"}  # one shard: the two backends ran it in turn
    runner, *gpu = jobs
    assert runner.queue == "endpoint" and not runner.succeeded  # it stopped for its pace (exit 3)
    assert runner.env["NIGHTBATCH_BACKEND"] == "endpoint"
    assert [j.succeeded for j in gpu] == [True] and gpu[0].queue in ("spot", "on-demand")
    pace = read_pace(services.adapters.blobs, batch_id, "00000")
    assert pace is not None and pace.move and "endpoint pace" in pace.reason

    batch = services.batches.get("default", batch_id)
    assert batch.status == "completed"
    assert batch.request_counts.model_dump() == {"total": LINES, "completed": LINES, "failed": 0}
    out = read_file_of(services, "default", batch.output_file_id)
    assert sorted(line["custom_id"] for line in out) == sorted(f"req-{i}" for i in range(1, LINES + 1))
    on_endpoint = [line for line in out if line["response"]["body"]["choices"][0]["message"]["content"]
                   == "from the endpoint"]
    assert 0 < len(on_endpoint) < LINES  # both backends ran some: each line once across the two
    ext: dict[str, Any] = batch.nightbatch or {}
    cost = ext["cost"]
    assert cost["lines_by_backend"] == {"batch": LINES - len(on_endpoint), "endpoint": len(on_endpoint)}
    assert cost["endpoint"]["lines"] == len(on_endpoint) and cost["endpoint"]["attempts"] == 1
    assert cost["endpoint"]["input_tokens"] == 3 * len(on_endpoint)  # the server's usage, as it answered
    assert ext["backend_moved"]["to"] == "batch" and ext["backend_moved"]["reason"].startswith("endpoint too slow")
    decisions = [(d["backend"], d["action"]) for d in ext["capacity"]]
    assert decisions[0] == ("endpoint", "run") and decisions[-1] == ("batch", "run")
    detail = backends_detail(ext)
    assert f"ran on batch ({LINES - len(on_endpoint)} lines)" in detail
    assert "moved to batch: endpoint too slow" in detail
    marker = json.loads(services.adapters.blobs.get_bytes(layout.done_key(batch_id, "00000")) or b"{}")
    assert marker["attempts"] == 2  # the runner's checkpointed lines were kept, not run again
    posts = [s for s in seen if s.method == "POST"]
    assert posts and {s.headers["authorization"] for s in posts} == {f"Bearer {KEY}"}
    assert {s.headers["x-gateway-inference-objective"] for s in posts} == {"batch-sheddable"}
    assert {s.body["model"] for s in posts if s.body} == {"meta-llama/Llama-3.1-8B-Instruct"}
