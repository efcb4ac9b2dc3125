"""X-Ray across API → Step Functions → task Lambdas, on real botocore and the real X-Ray SDK against moto.

The API Lambda runs no tracer (its cold import, issue #17): botocore itself forwards the invocation's trace
header on StartExecution. A task Lambda, in a fresh interpreter with Lambda's environment, sends its
subsegments to an X-Ray daemon address that this test listens on (UDP, as the Lambda runtime's daemon).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nightbatch.aws import Adapters
from nightbatch.aws.stepfunctions import StepFunctionsWorkflow

ROOT = Path(__file__).resolve().parents[2]
TRACE_ID = "1-5759e988-bd862e3fe1be46a994272793"
TRACE_HEADER = f"Root={TRACE_ID};Parent=53995c3f42cd8ad8;Sampled=1"


def test_the_api_forwards_its_trace_to_step_functions(adapters: Adapters, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "nightbatch-api")  # what the Lambda runtime sets
    monkeypatch.setenv("_X_AMZN_TRACE_ID", TRACE_HEADER)
    client = adapters.stepfunctions
    machine = client.create_state_machine(
        name="trace-test", roleArn="arn:aws:iam::123456789012:role/sfn",
        definition=json.dumps({"StartAt": "A", "States": {"A": {"Type": "Pass", "End": True}}}))["stateMachineArn"]
    sent: list[str] = []
    client.meta.events.register("before-send.sfn.StartExecution",
                                lambda request, **_: sent.append(request.headers.get("X-Amzn-Trace-Id", b"")))
    StepFunctionsWorkflow(client=client, state_machine_arn=machine).start("batch_trace")
    assert [h.decode() if isinstance(h, bytes) else h for h in sent] == [TRACE_HEADER]


def _received(sock: socket.socket) -> list[dict[str, Any]]:
    entities = []
    sock.setblocking(False)
    while True:
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            return entities
        header, _, body = data.decode().partition("\n")
        assert json.loads(header)["format"] == "json"
        entities.append(json.loads(body))


def test_a_task_lambda_traces_its_aws_calls_under_the_batch_id(adapters: Adapters) -> None:
    daemon = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    daemon.bind(("127.0.0.1", 0))
    env = {
        **os.environ, "PYTHONPATH": str(ROOT),
        # What Lambda sets for an invocation with active tracing.
        "LAMBDA_TASK_ROOT": str(ROOT), "AWS_LAMBDA_FUNCTION_NAME": "nightbatch-capacity",
        "_X_AMZN_TRACE_ID": TRACE_HEADER, "AWS_XRAY_DAEMON_ADDRESS": f"127.0.0.1:{daemon.getsockname()[1]}",
        "AWS_ENDPOINT_URL": str(adapters.endpoint_url), "NIGHTBATCH_MODE": "aws",
        "NIGHTBATCH_REGION": adapters.settings.deployment.region,
        "NIGHTBATCH_TABLE": adapters.settings.deployment.table,
        "NIGHTBATCH_BUCKET": adapters.settings.deployment.bucket,
    }
    code = ("import types, functions.tasks.capacity as c; print(c.handler({'batch_id': 'batch_traced', "
            "'shard_id': '0'}, types.SimpleNamespace(aws_request_id='r1'))['action'])")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "give_up"  # the batch does not exist: a DynamoDB read, the decision to S3
    entities = _received(daemon)
    daemon.close()
    handler = next(e for e in entities if e["name"] == "## handler")
    assert handler["trace_id"] == TRACE_ID and handler["parent_id"] == TRACE_HEADER.split("Parent=")[1][:16]
    assert handler["annotations"]["batch_id"] == "batch_traced"
    assert "metadata" not in handler  # responses are not recorded
    calls = {e["aws"]["operation"] for e in entities if e.get("namespace") == "aws"
             and e["trace_id"] == TRACE_ID and e["parent_id"] == handler["id"]}
    assert "GetItem" in calls
