"""Batch state changes on EventBridge (nightbatch/notifications/state_changes.py): a rule on the default bus matching
`source: nightbatch` forwards every event to an SQS queue (moto delivers rule targets), and a batch run through
Validate → Plan → the real shard runner (deterministic engine) → Finalize → Notify leaves one event per
transition there, in order. A bus that refuses the put never fails a transition; the terminal event is retried
by the Notify step with the other channels."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import io
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from gpu_worker.main import serve_shard
from gpu_worker.runner import ShardJob
from nightbatch.aws import make_adapters
from nightbatch.aws.records import BatchRecord, EventRecord
from nightbatch.batches.request import CreateBatchRequest
from nightbatch.notifications import NotifyError, notify_batch
from nightbatch.notifications.state_changes import DETAIL_TYPE, SOURCE
from nightbatch.pipeline import BatchTaskInput, finalize_batch
from nightbatch.wiring import Services, build_notifier, build_services
from tests.pipeline.test_pipeline import run_to_shards
from tests.support.pipeline_world import RecordingWorkflow, chat_line, jsonl, make_batch
from tests.support.pipeline_world import services as services  # the fixture, shared
from tests.worker.processes import DETERMINISTIC

REGION = "us-east-1"


def _with_bus(base: Services, bus: str) -> Services:
    """The workflow tests' services (moto in-process, bucket and table made) with state changes on `bus`."""
    settings = base.settings.updated({"event_bus": bus, "worker_poll_seconds": 0.1, "checkpoint_every_seconds": 0.2})
    return build_services(make_adapters(settings), RecordingWorkflow())


@pytest.fixture
def aws(services: Services) -> Services:
    return services


def rule_queue(bus: str = "default") -> str:
    """An SQS queue behind a rule on the bus that matches nightbatch's state changes: what a user would set up."""
    sqs, events = boto3.client("sqs", region_name=REGION), boto3.client("events", region_name=REGION)
    url = sqs.create_queue(QueueName=f"nightbatch-events-{bus}")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    events.put_rule(Name="nightbatch-batches", EventBusName=bus, EventPattern=json.dumps(
        {"source": [SOURCE], "detail-type": [DETAIL_TYPE]}))
    events.put_targets(Rule="nightbatch-batches", EventBusName=bus, Targets=[{"Id": "queue", "Arn": arn}])
    return url


def drain(url: str) -> list[dict[str, Any]]:
    sqs = boto3.client("sqs", region_name=REGION)
    out: list[dict[str, Any]] = []
    while messages := sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", []):
        for m in messages:
            out.append(json.loads(m["Body"]))
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    return out


def run_batch(services: Services, lines: int) -> str:
    """Create → Validate → Plan → every shard on the real runner → Finalize → Notify, as the workflow chains them."""
    batch_id = make_batch(services, jsonl([chat_line(i) for i in range(1, lines + 1)]),
                          metadata={"run": "nightly"})
    for shard in run_to_shards(services, batch_id):
        code = asyncio.run(serve_shard(ShardJob(batch_id=batch_id, shard_id=shard), services.settings,
                                       services.adapters, engine_path=DETERMINISTIC))
        assert code == 0
    assert finalize_batch(BatchTaskInput(batch_id=batch_id), services).status == "completed"
    notifier = build_notifier(services.adapters)
    try:
        assert notify_batch(batch_id, notifier=notifier).bus_event_id
    finally:
        notifier.close()
    return batch_id


def test_every_state_change_of_a_batch_arrives_on_the_rule_target(aws: Services) -> None:
    url = rule_queue()
    services = _with_bus(aws, "default")
    batch_id = run_batch(services, 5)
    events = drain(url)
    print(json.dumps(events[-1], indent=2))  # the report quotes the event as moto delivered it
    assert [e["detail"]["status"] for e in events] == ["validating", "in_progress", "finalizing", "completed"]
    assert [e["detail"]["previous_status"] for e in events] == [None, "validating", "in_progress", "finalizing"]
    for e in events:
        assert e["source"] == SOURCE and e["detail-type"] == DETAIL_TYPE and e["region"] == REGION
        assert e["detail"]["batch_id"] == batch_id and e["detail"]["version"] == "1"
        assert e["detail"]["tenant"] == "default" and e["detail"]["metadata"] == {"run": "nightly"}
    last = events[-1]["detail"]
    batch = services.batches.get("default", batch_id)
    assert last["request_counts"] == {"total": 5, "completed": 5, "failed": 0} == batch.request_counts.model_dump()
    assert last["output_file_id"] == batch.output_file_id and last["changed_at"] == batch.completed_at
    assert last["failure_message"] is None and last["model"] == "SmolLM2-135M-Instruct"
    # The terminal event is marked on the batch's event item: a second Notify puts nothing again.
    notifier = build_notifier(services.adapters)
    try:
        assert notify_batch(batch_id, notifier=notifier).bus_event_id == events[-1]["id"]
    finally:
        notifier.close()
    assert drain(url) == []


def test_cancel_is_a_state_change_too(aws: Services) -> None:
    url = rule_queue()
    services = _with_bus(aws, "default")
    batch_id = make_batch(services, jsonl([chat_line(i) for i in range(1, 4)]))
    run_to_shards(services, batch_id)
    services.batches.cancel("default", batch_id)
    finalize_batch(BatchTaskInput(batch_id=batch_id), services)
    notifier = build_notifier(services.adapters)
    try:
        notify_batch(batch_id, notifier=notifier)
    finally:
        notifier.close()
    changes = [(e["detail"]["previous_status"], e["detail"]["status"]) for e in drain(url)]
    assert changes == [(None, "validating"), ("validating", "in_progress"), ("in_progress", "cancelling"),
                       ("cancelling", "cancelled")]


def test_a_refused_put_never_fails_a_transition_and_the_terminal_event_is_retried(aws: Services) -> None:
    services = _with_bus(aws, "nightbatch-ops")  # a custom bus that does not exist yet: every put is refused
    batch_id = make_batch(services, jsonl([chat_line(i) for i in range(1, 4)]))
    for shard in run_to_shards(services, batch_id):
        assert asyncio.run(serve_shard(ShardJob(batch_id=batch_id, shard_id=shard), services.settings,
                                       services.adapters, engine_path=DETERMINISTIC)) == 0
    assert finalize_batch(BatchTaskInput(batch_id=batch_id), services).status == "completed"
    notifier = build_notifier(services.adapters)
    try:
        with pytest.raises(NotifyError, match="eventbridge"):
            notify_batch(batch_id, notifier=notifier)
        table = services.adapters.table
        event = table.get_record(EventRecord, EventRecord.pk_of(batch_id, "completed"))
        assert event is not None and event.pending and event.bus_event_id is None  # the sweeper re-drives it
        # The bus appears (an operator creates it); the retry puts only what is missing.
        boto3.client("events", region_name=REGION).create_event_bus(Name="nightbatch-ops")
        url = rule_queue("nightbatch-ops")
        result = notify_batch(batch_id, notifier=notifier)
    finally:
        notifier.close()
    (arrived,) = drain(url)
    assert arrived["id"] == result.bus_event_id and arrived["detail"]["status"] == "completed"
    event = services.adapters.table.get_record(EventRecord, EventRecord.pk_of(batch_id, "completed"))
    assert event is not None and not event.pending
    record = services.adapters.table.get_record(BatchRecord, batch_id)
    assert record is not None and record.status == "completed"


class _TimedWorkflow(RecordingWorkflow):
    def __init__(self) -> None:
        super().__init__()
        self.at: list[float] = []

    def start(self, batch_id: str) -> None:
        self.at.append(time.monotonic())
        super().start(batch_id)


@contextlib.contextmanager
def slow_bus(hold_seconds: float) -> Iterator[str]:
    """An EventBridge endpoint that holds every request `hold_seconds` before it accepts it: a slow bus."""
    release = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            release.wait(hold_seconds)
            body = b'{"FailedEntryCount":0,"Entries":[{"EventId":"slow-1"}]}'
            try:
                self.send_response(200)
                self.send_header("Content-Type", "application/x-amz-json-1.1")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except OSError:  # the client gave up on it
                pass

        def log_message(self, *args: Any) -> None:
            return None

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        release.set()
        server.shutdown()
        server.server_close()


def test_a_slow_bus_delays_neither_the_workflow_start_nor_the_create_or_cancel(
        aws: Services, monkeypatch: pytest.MonkeyPatch) -> None:
    hold = 15.0
    with slow_bus(hold) as endpoint:
        monkeypatch.setenv("AWS_ENDPOINT_URL_EVENTBRIDGE", endpoint)  # the events client alone; the rest is moto
        workflow = _TimedWorkflow()
        settings = aws.settings.updated({"event_bus": "default"})
        services = build_services(make_adapters(settings), workflow)
        payload = jsonl([chat_line(i) for i in range(1, 4)])
        f = services.files.create("default", filename="in.jsonl", purpose="batch", fileobj=io.BytesIO(payload),
                                  size=len(payload))
        t0 = time.monotonic()
        batch = services.batches.create("default", CreateBatchRequest(
            input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"))
        created = time.monotonic() - t0
        assert workflow.started == [batch.id]
        assert workflow.at[0] - t0 < 2.0, "the workflow waited for the bus"
        # Two attempts of ~2 s each (plus backoff), well under API Gateway's 29 s and the bus's hold.
        assert created < 8.0, created
        t0 = time.monotonic()
        assert services.batches.cancel("default", batch.id).status == "cancelling"
        assert time.monotonic() - t0 < 8.0
