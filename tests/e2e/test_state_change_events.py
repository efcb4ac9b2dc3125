"""Batch state changes on EventBridge, end to end: the session's `nightbatch local` puts them on its embedded AWS's
default bus (NIGHTBATCH_EVENT_BUS=default), and a rule matching nightbatch's events forwards them to an SQS
queue, as a user would wire it in their account. A batch run by the real engine through the stock SDK leaves
its whole life there, in order."""

from __future__ import annotations

import io
import json
import time
from typing import Any

import boto3
import pytest

from nightbatch.notifications.state_changes import DETAIL_TYPE, SOURCE
from tests.e2e.conftest import LocalStack
from tests.e2e.sdk import wait

pytestmark = pytest.mark.e2e


def _events_queue(endpoint: str) -> tuple[Any, str]:
    kw: dict[str, Any] = {"endpoint_url": endpoint, "region_name": "us-east-1",
                          "aws_access_key_id": "local", "aws_secret_access_key": "local"}
    sqs, events = boto3.client("sqs", **kw), boto3.client("events", **kw)
    url = sqs.create_queue(QueueName="e2e-batch-state-changes")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    events.put_rule(Name="e2e-batch-state-changes", EventPattern=json.dumps(
        {"source": [SOURCE], "detail-type": [DETAIL_TYPE]}))
    events.put_targets(Rule="e2e-batch-state-changes", Targets=[{"Id": "queue", "Arn": arn}])
    return sqs, url


def _received(sqs: Any, url: str, batch_id: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    while messages := sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", []):
        for m in messages:
            event = json.loads(m["Body"])
            if event["detail"]["batch_id"] == batch_id:  # other tests' batches share the bus
                found.append(event)
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    return found


def test_a_batch_s_state_changes_arrive_on_a_rule_s_queue(local_stack: LocalStack) -> None:
    sqs, url = _events_queue(local_stack.aws_endpoint_url)
    client = local_stack.client()
    lines = [{"custom_id": f"ev-{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "SmolLM2-135M-Instruct", "max_tokens": 8,
                       "messages": [{"role": "user", "content": f"Say {i}."}]}} for i in range(2)]
    f = client.files.create(file=("events.jsonl", io.BytesIO(b"".join(json.dumps(x).encode() + b"\n" for x in lines))),
                            purpose="batch")
    batch = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h",
                                  metadata={"suite": "e2e"})
    assert wait(client, batch.id).status == "completed"
    events: list[dict[str, Any]] = []
    deadline = time.monotonic() + 60  # the terminal event goes with the Notify step, just after the status
    while time.monotonic() < deadline and not any(e["detail"]["status"] == "completed" for e in events):
        events += _received(sqs, url, batch.id)
        time.sleep(0.5)
    statuses = [e["detail"]["status"] for e in events]
    assert statuses[0] == "validating" and statuses[-1] == "completed", statuses
    assert statuses.index("in_progress") < statuses.index("finalizing") < statuses.index("completed"), statuses
    done = events[-1]
    assert done["source"] == SOURCE and done["detail-type"] == DETAIL_TYPE
    assert done["detail"]["previous_status"] == "finalizing"
    assert done["detail"]["request_counts"] == {"total": 2, "completed": 2, "failed": 0}
    assert done["detail"]["metadata"] == {"suite": "e2e"}
    assert done["detail"]["output_file_id"] == client.batches.retrieve(batch.id).output_file_id
    print(json.dumps(done))  # the closing note quotes one as moto delivered it
