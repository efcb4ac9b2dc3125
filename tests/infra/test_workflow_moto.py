"""The synthesized state machine, executed by moto's Step Functions interpreter with the real task handlers.

A batch is created through the core's services exactly as the API does (StartExecution named after the
batch id), and the definition from the template runs Validate → Plan → Distributed Map of Batch
submitJob.sync → Finalize → Notify in-process.
"""

from __future__ import annotations

import importlib
import io
import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import boto3
import openai
import pytest
from moto import mock_aws
from openai.types.webhooks import BatchFailedWebhookEvent

from functions.tasks.notify import default_notifier
from infra.orchestration import TASK_RETRIES
from nightbatch.batches.request import CreateBatchRequest
from nightbatch.notifications.objects import CreateWebhookEndpointRequest
from nightbatch.settings import get_settings
from nightbatch.shards.spec import read_manifest
from nightbatch.wiring import Services, default_services
from tests.infra.cfn import of_type, one_of_type
from tests.infra.moto_workflow import (
    ACCOUNT,
    MOTO_CONFIG,
    REGION,
    Deployment,
    create_resources,
    entered_states,
    fixture_environment,
    patch_backend_lookup,
    patch_batch,
    patch_lambda,
    patch_task_normalisation,
    wait_for_execution,
    worker_in_process,
)
from tests.infra.synth import TEST_CONTEXT
from tests.notifications.support import Receiver
from tests.support.pipeline_world import shard_requests_of

MODEL = "Qwen2.5-7B-Instruct"  # the first served model in cdk.json
SHARD_ATTEMPTS = 1 + TEST_CONTEXT["shardRetry"]["maxAttempts"]
ENGINE = "tests.support.deterministic_engine:DeterministicEngine"  # the runner's test double
# Handlers main has not provided yet; the dispatcher answers them with {} (remove as they land).
ALLOWED_STAND_INS: set[str] = set()


def _clear_caches() -> None:
    get_settings.cache_clear()
    default_services.cache_clear()


@pytest.fixture
def deployment(template: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Iterator[Deployment]:
    yield from deploy_in_moto(template, monkeypatch)


def deploy_in_moto(template: dict[str, Any], monkeypatch: pytest.MonkeyPatch, *,
                   backend_lookup: bool = False) -> Iterator[Deployment]:
    """The template's resources in moto and its handlers in-process, for a fixture to yield from."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.setenv(name, "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws(config=MOTO_CONFIG):
        patch_task_normalisation(monkeypatch)
        d = create_resources(template)
        if backend_lookup:
            patch_backend_lookup(monkeypatch)
        patch_lambda(monkeypatch, d)
        patch_batch(monkeypatch, d)
        yield from _with_environment(monkeypatch, d)


def _with_environment(monkeypatch: pytest.MonkeyPatch, d: Deployment) -> Iterator[Deployment]:
    for _ in fixture_environment(monkeypatch, d):
        _clear_caches()
        try:
            yield d
        finally:
            _clear_caches()
    assert d.stand_ins <= ALLOWED_STAND_INS


def chat_line(i: int) -> dict[str, Any]:
    return {"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": [{"role": "user", "content": f"question {i}"}], "max_tokens": 8}}


def create_batch(payload: bytes, options: dict[str, Any] | None = None) -> tuple[Services, str]:
    services = default_services()
    file = services.files.create("default", filename="in.jsonl", purpose="batch", fileobj=io.BytesIO(payload),
                                 size=len(payload))
    batch = services.batches.create("default", CreateBatchRequest(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h", nightbatch=options))
    return services, batch.id


def execution_arn(d: Deployment, batch_id: str) -> str:
    return d.state_machine_arn.replace(":stateMachine:", ":execution:") + f":{batch_id}"


def read_file(services: Services, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    data = b"".join(services.files.chunks(services.files.item("default", file_id)))
    return [json.loads(line) for line in data.splitlines()]


def jsonl(lines: list[Any]) -> bytes:
    return b"".join((x if isinstance(x, bytes) else json.dumps(x).encode()) + b"\n" for x in lines)


def test_invalid_input_fails_without_running_shards(deployment: Deployment) -> None:
    services, batch_id = create_batch(jsonl([chat_line(1), b"{not json", chat_line(3)]))
    execution = wait_for_execution(execution_arn(deployment, batch_id))
    assert execution["status"] == "SUCCEEDED", execution
    assert entered_states(execution["executionArn"]) == ["Validate", "IsValid", "Notify"]
    assert deployment.jobs == []
    batch = services.batches.get("default", batch_id)
    assert batch.status == "failed"
    assert batch.errors is not None
    assert [(e.code, e.line) for e in batch.errors.data] == [("invalid_json_line", 2)]
    assert batch.output_file_id is None and batch.error_file_id is None
    assert deployment.invoked("notify") == [{"version": 1, "batch_id": batch_id}]
    [(message, attributes)] = sns_messages(deployment, batch_id)
    assert json.loads(message)["status"] == "failed"
    assert attributes["event_type"]["Value"] == "batch.failed" and attributes["tenant"]["Value"] == "default"


def sns_messages(d: Deployment, batch_id: str) -> list[tuple[str, dict[str, Any]]]:
    """What the real Notify handler published to the template's topic about `batch_id` (moto's record)."""
    from moto.sns.models import sns_backends

    topic_id, _ = one_of_type(d.template, "AWS::SNS::Topic")
    sent = sns_backends[ACCOUNT][REGION].topics[d.refs[topic_id]].sent_notifications
    return [(message, attributes) for _, message, _, attributes, _ in sent if json.loads(message)["id"] == batch_id]


def test_notify_queues_the_webhook_event_and_the_template_s_queue_consumer_delivers_it(
        deployment: Deployment, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NIGHTBATCH_ALLOW_PRIVATE_TARGETS", "true")  # the receiver is on loopback
    _clear_caches()
    receiver = Receiver()
    try:
        endpoint = default_notifier().endpoints.create("default", CreateWebhookEndpointRequest(
            name="ci", url=receiver.url, event_types=["batch.failed"]))
        _, batch_id = create_batch(jsonl([b"{not json"]))
        assert wait_for_execution(execution_arn(deployment, batch_id))["status"] == "SUCCEEDED"

        # The queue Notify wrote to is the one the template's event source mapping feeds to its function.
        sqs = boto3.client("sqs", region_name=REGION)
        [(queue_id, handler)] = [(m["Properties"]["EventSourceArn"]["Fn::GetAtt"][0],
                                  deployment.handlers[m["Properties"]["FunctionName"]["Ref"]])
                                 for m in of_type(deployment.template, "AWS::Lambda::EventSourceMapping").values()
                                 if "Webhook" in m["Properties"]["EventSourceArn"]["Fn::GetAtt"][0]]
        messages = sqs.receive_message(QueueUrl=deployment.refs[queue_id], MaxNumberOfMessages=10)["Messages"]
        assert len(messages) == 1
        module, _, attr = handler.rpartition(".")
        records = [{"messageId": m["MessageId"], "body": m["Body"]} for m in messages]
        result = getattr(importlib.import_module(module), attr)({"Records": records}, None)
        assert result == {"batchItemFailures": []}

        [received] = receiver.wait_for(1)
        client = openai.OpenAI(api_key="unused", base_url="http://127.0.0.1:9/v1",
                               webhook_secret=endpoint.signing_secret)
        event = client.webhooks.unwrap(received.body, received.headers)
        assert isinstance(event, BatchFailedWebhookEvent) and event.data.id == batch_id
    finally:
        receiver.close()


def _small_shards(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plan reads its shard size from the environment: make a dozen lines several shards."""
    monkeypatch.setenv("NIGHTBATCH_SHARD_TARGET_TOKENS", "60")
    monkeypatch.setenv("NIGHTBATCH_SEGMENT_MAX_LINES", "3")
    _clear_caches()


def _shard_lines(services: Services, batch_id: str, shard_id: str) -> set[str]:
    return {r.custom_id for r in shard_requests_of(services, batch_id, shard_id)}


def assert_only_shard_failed(services: Services, batch_id: str, shard_id: str, *, lines: int) -> None:
    """The batch completed with each line once: the shard's lines `shard_failed`, every other one answered."""
    batch = services.batches.get("default", batch_id)
    assert batch.status == "completed"
    failed_lines = _shard_lines(services, batch_id, shard_id)
    errors, output = read_file(services, batch.error_file_id), read_file(services, batch.output_file_id)
    assert {line["custom_id"] for line in errors} == failed_lines
    assert {line["error"]["code"] for line in errors} == {"shard_failed"}
    assert sorted(line["custom_id"] for line in errors + output) == sorted(f"req-{i}" for i in range(1, lines + 1))
    assert batch.request_counts.model_dump() == {"total": lines, "completed": lines - len(failed_lines),
                                                 "failed": len(failed_lines)}


def test_failing_shard_is_retried_then_caught_and_its_lines_end_shard_failed(
        deployment: Deployment, monkeypatch: pytest.MonkeyPatch) -> None:
    _small_shards(monkeypatch)
    deployment.shard_runner = worker_in_process(monkeypatch, engine=ENGINE)
    deployment.failing_shards.add("00001")
    services, batch_id = create_batch(jsonl([chat_line(i) for i in range(1, 13)]))
    execution = wait_for_execution(execution_arn(deployment, batch_id))
    assert execution["status"] == "SUCCEEDED", execution
    states = entered_states(execution["executionArn"])
    assert states[:4] == ["Validate", "IsValid", "Plan", "Shards"] and states[-2:] == ["Finalize", "Notify"]

    shard_ids = {job.env["NIGHTBATCH_SHARD_ID"] for job in deployment.jobs}
    assert len(shard_ids) > 2 and "00001" in shard_ids
    for shard_id in shard_ids:
        runs = [j for j in deployment.jobs if j.env["NIGHTBATCH_SHARD_ID"] == shard_id]
        assert {j.name for j in runs} == {f"{batch_id}-{shard_id}"}
        assert runs[0].env["NIGHTBATCH_BATCH_ID"] == batch_id
        assert runs[0].env["NIGHTBATCH_BUCKET"] == "nb-data"  # the job definition's environment, merged
        if shard_id == "00001":  # first run plus the state machine's retries, then caught
            assert len(runs) == SHARD_ATTEMPTS and not any(j.succeeded for j in runs)
        else:
            assert [j.succeeded for j in runs] == [True], runs

    assert_only_shard_failed(services, batch_id, "00001", lines=12)


def test_capacity_failing_for_one_shard_gives_up_that_shard_alone(deployment: Deployment,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """An exception in Capacity inside the Distributed Map (an AWS error past its retries, a bug) must not fail the
    Map Run, which would stop every running shard and its job: a transient one is retried in place, a lasting one
    gives that shard up (its lines end `shard_failed`) and every other shard runs to the end."""
    import functions.tasks.capacity as capacity_task

    _small_shards(monkeypatch)
    deployment.shard_runner = worker_in_process(monkeypatch, engine=ENGINE)
    decide, calls = capacity_task.decide, Counter[str]()

    def failing(item: dict[str, Any], services: Services) -> Any:
        calls[item["shard_id"]] += 1
        if item["shard_id"] == "00001":
            raise RuntimeError("simulated: Capacity cannot decide")
        if item["shard_id"] == "00002" and calls["00002"] == 1:
            raise RuntimeError("simulated: a transient failure")
        return decide(item, services)

    monkeypatch.setattr(capacity_task, "decide", failing)
    services, batch_id = create_batch(jsonl([chat_line(i) for i in range(1, 13)]))
    execution = wait_for_execution(execution_arn(deployment, batch_id))
    assert execution["status"] == "SUCCEEDED", execution
    shard_ids = {item.shard_id for item in read_manifest(services.adapters.blobs, batch_id)}
    assert len(shard_ids) > 2
    assert calls["00001"] == 1 + TASK_RETRIES["capacity"][0] and calls["00002"] == 2  # retried in place
    ran = {job.shard_id for job in deployment.jobs}
    assert ran == shard_ids - {"00001"} and all(job.succeeded for job in deployment.jobs)
    assert_only_shard_failed(services, batch_id, "00001", lines=12)


def test_valid_batch_completes_with_one_output_line_per_input(deployment: Deployment,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    _small_shards(monkeypatch)
    deployment.shard_runner = worker_in_process(monkeypatch, engine=ENGINE)
    services, batch_id = create_batch(jsonl([chat_line(i) for i in range(1, 13)]))
    execution = wait_for_execution(execution_arn(deployment, batch_id))
    assert execution["status"] == "SUCCEEDED", execution
    assert len(deployment.jobs) > 1 and all(j.succeeded for j in deployment.jobs)
    batch = services.batches.get("default", batch_id)
    assert batch.status == "completed"
    output = read_file(services, batch.output_file_id)
    assert sorted(line["custom_id"] for line in output) == sorted(f"req-{i}" for i in range(1, 13))
    assert read_file(services, batch.error_file_id) == []
    assert batch.request_counts.model_dump() == {"total": 12, "completed": 12, "failed": 0}
    [(message, _)] = sns_messages(deployment, batch_id)
    assert json.loads(message)["output_file_id"] == batch.output_file_id


def test_output_in_input_order_over_shards_of_interleaved_lines(deployment: Deployment,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """`nightbatch.output_order: "input"` through the synthesized workflow: two long system prompts alternate,
    so Plan keeps each prompt's lines in shards of their own (prefix-aware placement) and every shard's lines
    interleave with another's; the shards run at once and finish in any order. The output file is in input
    order (in completion order it would be shard after shard)."""
    _small_shards(monkeypatch)
    deployment.shard_runner = worker_in_process(monkeypatch, engine=ENGINE)
    systems = ["You are assistant A. " * 60, "You are assistant B. " * 60]  # over plan_prefix_chars each
    lines = [chat_line(i) for i in range(1, 13)]
    for i, line in enumerate(lines):
        line["body"]["messages"].insert(0, {"role": "system", "content": systems[i % 2]})
    services, batch_id = create_batch(jsonl(lines), {"output_order": "input"})
    execution = wait_for_execution(execution_arn(deployment, batch_id))
    assert execution["status"] == "SUCCEEDED", execution
    batch = services.batches.get("default", batch_id)
    assert batch.status == "completed" and batch.model_dump()["nightbatch"]["output_order"] == "input"
    by_shard = [r.number for item in read_manifest(services.adapters.blobs, batch_id)
                for r in shard_requests_of(services, batch_id, item.shard_id)]
    assert len(deployment.jobs) > 2 and by_shard != sorted(by_shard)  # shards of interleaved lines
    assert [line["custom_id"] for line in read_file(services, batch.output_file_id)] == [
        f"req-{i}" for i in range(1, 13)]
