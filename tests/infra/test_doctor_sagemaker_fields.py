"""`nightbatch doctor --stack` proves which unlisted CreateTrainingJob fields Step Functions accepts in the account
(nightbatch/cli/doctor/sagemaker_fields.py), on the RunShardSageMaker state this app synthesizes.

Step Functions is a botocore Stubber (moto has no TestState): it answers DescribeStateMachine with the synthesized
definition and each TestState as AWS would (a SageMaker error once Step Functions passed the request on, an
InvalidDefinition for a refused fixed field, States.Runtime for a refused run-time one). What the doctor sent is
recorded from the client's own request parameters.
"""

from __future__ import annotations

import datetime
import json
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from nightbatch.aws.account import AwsAccount
from nightbatch.cli.doctor.prerequisites import template_outputs
from nightbatch.cli.doctor.report import Check, Report
from nightbatch.cli.doctor.sagemaker_fields import STATE, prove
from nightbatch.pipeline.training_jobs import UNLISTED_FIELDS, deployment_job_prefix
from tests.infra.synth import Synth
from tests.infra.test_state_machine_definition import render_definition

STACK = "nightbatch-prod"
REGION = "us-east-1"
MACHINE = f"arn:aws:states:{REGION}:123456789012:stateMachine:Workflow"
ROLE = "arn:aws:iam::123456789012:role/nightbatch-prod-WorkflowRole"
# SageMaker's answer to the probe's 64-character name: Step Functions passed the request on.
SAGEMAKER_REFUSED = ("FAILED", "SageMaker.AmazonSageMakerException", "1 validation error detected: Value at "
                     "'trainingJobName' failed to satisfy constraint: Member must have length less than or equal to 63")


def refused_at_run_time(field: str) -> tuple[str, str, str]:
    return ("FAILED", "States.Runtime", f"An error occurred while executing the state '{STATE}'. The field "
            f"'{field}' is not supported by Step Functions")


def refused_in_definition(field: str) -> str:
    return f'SCHEMA_VALIDATION_FAILED: The field "{field}" is not supported by Step Functions at /Parameters'


def account(synth: Synth, answers: list[tuple[str, str, str] | str],
            sent: list[dict[str, Any]]) -> AwsAccount:
    """Step Functions answering DescribeStateMachine with the synthesized definition, then each TestState with the
    next answer (a string: InvalidDefinition with that message); the TestState requests land in `sent`."""
    client = boto3.client("stepfunctions", region_name=REGION, aws_access_key_id="testing",
                          aws_secret_access_key="testing")
    stub = Stubber(client)
    stub.add_response("describe_state_machine", {
        "stateMachineArn": MACHINE, "name": "Workflow", "definition": json.dumps(render_definition(synth.template)),
        "roleArn": ROLE, "type": "STANDARD", "creationDate": datetime.datetime(2026, 1, 1)})
    for answer in answers:
        if isinstance(answer, str):
            stub.add_client_error("test_state", service_error_code="InvalidDefinition", service_message=answer)
        else:
            status, error, cause = answer
            stub.add_response("test_state", {"status": status, "error": error, "cause": cause})
    stub.activate()
    client.meta.events.register("provide-client-params.stepfunctions.TestState",
                                lambda params, **_: sent.append(dict(params)))
    return AwsAccount(lambda name: client, REGION)


def outputs(synth: Synth) -> dict[str, str]:
    return {**template_outputs(synth.template), "StateMachineArn": MACHINE, "BucketName": "nb-data"}


def proven(synth: Synth, answers: list[tuple[str, str, str] | str]) -> tuple[dict[str, Check], list[dict[str, Any]]]:
    sent: list[dict[str, Any]] = []
    report = Report(base_url="", stack=STACK)
    prove(report, account(synth, answers, sent), outputs(synth), STACK)
    return {c.detail.split(":")[0]: c for c in report.checks}, sent


def _unlisted(state: dict[str, Any], state_input: dict[str, Any]) -> set[str]:
    params = state["Parameters"]
    found = {f for f in ("RetryStrategy",) if f in params}
    found |= {f for f in ("ContainerEntrypoint",) if f in params["AlgorithmSpecification"]}
    return found | {f for f in ("MaxPendingTimeInSeconds",) if f in state_input["capacity"]["stopping_condition"]}


def test_the_doctor_proves_each_field_with_the_deployed_task_and_role_and_says_which_to_turn_on(
        sagemaker_synth: Synth) -> None:
    checks, sent = proven(sagemaker_synth, [SAGEMAKER_REFUSED, refused_in_definition("ContainerEntrypoint"),
                                            SAGEMAKER_REFUSED, refused_at_run_time("MaxPendingTimeInSeconds")])
    # Once without the fields, then once with each, as the workflow's own role.
    assert len(sent) == 1 + len(UNLISTED_FIELDS) and {r["roleArn"] for r in sent} == {ROLE}
    probes = [(json.loads(r["definition"]), json.loads(r["input"])) for r in sent]
    assert [_unlisted(s, i) for s, i in probes] == [set(), *({f} for f in UNLISTED_FIELDS)]
    deployed = render_definition(sagemaker_synth.template)["States"]["Shards"]["ItemProcessor"]["States"][STATE]
    for state, state_input in probes:
        # The deployed task as a request-response call (TestState runs `.sync` only against a mock).
        assert state["Resource"] == deployed["Resource"].removesuffix(".sync") and state["End"] is True
        assert set(state) == {"Type", "Resource", "Parameters", "End"}
        assert state["Parameters"]["Environment"] == deployed["Parameters"]["Environment"]
        # A name SageMaker refuses (64 > 63) in the prefix the role may create: no job can start.
        name = state_input["capacity"]["job_name"]
        assert len(name) == 64 and name.startswith(deployment_job_prefix(STACK))
    assert checks["ContainerEntrypoint"].status == "ok" and "refuses it" in checks["ContainerEntrypoint"].detail
    retry = checks["RetryStrategy"]
    assert retry.status == "warn" and retry.detail == "RetryStrategy: Step Functions accepts it in us-east-1; not sent"
    assert 'cdk.json "sagemakerFields": {"RetryStrategy": true}, then cdk deploy' in retry.remedy
    assert checks["MaxPendingTimeInSeconds"].status == "ok"
    assert "not sent (keep it off)" in checks["MaxPendingTimeInSeconds"].detail


def test_a_field_the_deployment_sends_but_step_functions_refuses_fails_the_doctor(
        sagemaker_fields_synth: Synth) -> None:
    checks, _ = proven(sagemaker_fields_synth, [SAGEMAKER_REFUSED, SAGEMAKER_REFUSED,
                                                refused_at_run_time("RetryStrategy"), SAGEMAKER_REFUSED])
    assert checks["ContainerEntrypoint"].status == "ok" and checks["ContainerEntrypoint"].detail.endswith("; sent")
    failed = checks["RetryStrategy"]
    assert failed.status == "failed" and "every SageMaker shard fails" in failed.detail
    assert '"sagemakerFields": {"RetryStrategy": false}' in failed.remedy


@pytest.mark.parametrize("baseline", [("FAILED", "States.Runtime", "The JSONPath '$.capacity.x' could not be found"),
                                      ("FAILED", "States.TaskFailed", "AccessDenied")])
def test_without_a_working_baseline_nothing_is_claimed(sagemaker_synth: Synth, baseline: tuple[str, str, str]) -> None:
    checks, sent = proven(sagemaker_synth, [baseline])
    assert len(sent) == 1
    [check] = checks.values()
    assert check.status == "warn" and "could not prove" in check.detail and "sagemakerFields" in check.remedy
