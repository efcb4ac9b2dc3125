"""The Step Functions workflow port against moto: one execution per batch, named after it; starts never raise."""

from __future__ import annotations

import json

from botocore.config import Config

from nightbatch.aws import Adapters
from nightbatch.aws.stepfunctions import StepFunctionsWorkflow

PASS_DEFINITION = json.dumps({"StartAt": "Done", "States": {"Done": {"Type": "Pass", "End": True}}})


def make_state_machine(adapters: Adapters, name: str) -> str:
    arn: str = adapters.stepfunctions.create_state_machine(
        name=name, definition=PASS_DEFINITION, roleArn="arn:aws:iam::123456789012:role/sfn",
    )["stateMachineArn"]
    return arn


def test_start_names_the_execution_after_the_batch_and_is_idempotent(adapters: Adapters) -> None:
    arn = make_state_machine(adapters, adapters.settings.deployment.table)
    workflow = StepFunctionsWorkflow(client=adapters.stepfunctions, state_machine_arn=arn)
    workflow.start("batch_abc")
    workflow.start("batch_abc")  # a retried create: no second run, no error
    executions = adapters.stepfunctions.list_executions(stateMachineArn=arn)["executions"]
    assert [e["name"] for e in executions] == ["batch_abc"]
    described = adapters.stepfunctions.describe_execution(executionArn=executions[0]["executionArn"])
    assert json.loads(described["input"]) == {"version": 1, "batch_id": "batch_abc"}


def test_start_failures_are_logged_not_raised(adapters: Adapters) -> None:
    # The batch already exists when start runs; raising would 500 the create and make the SDK retry it.
    StepFunctionsWorkflow(client=adapters.stepfunctions, state_machine_arn="").start("batch_x")
    missing = "arn:aws:states:us-east-1:123456789012:stateMachine:missing"
    StepFunctionsWorkflow(client=adapters.stepfunctions, state_machine_arn=missing).start("batch_x")
    unreachable = adapters.session.client(
        "stepfunctions", endpoint_url="http://127.0.0.1:9",
        config=Config(connect_timeout=1, retries={"max_attempts": 1}),
    )
    StepFunctionsWorkflow(client=unreachable, state_machine_arn=missing).start("batch_x")
