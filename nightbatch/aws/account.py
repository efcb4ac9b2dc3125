"""Read-only views of a deployed stack's AWS account, for `nightbatch doctor`.

Stack outputs and resources (CloudFormation), the jobs of a batch and the queue's compute environments (AWS
Batch), the batch's execution history (Step Functions), GPU vCPU quotas (Service Quotas), Lambda's concurrency
quota, the EC2 Spot service-linked role (IAM), SES production access (SES v2), whether a secret exists and the tail
of a job's log.
Nothing here writes; the one call that is not a read, TestState (the doctor's proof of the SageMaker task's fields),
makes a CreateTrainingJob request SageMaker refuses. A read the caller may not make (AccessDenied) or that fails
becomes `AccountReadError`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError

SPOT_SERVICE_LINKED_ROLE = "AWSServiceRoleForEC2Spot"


class AccountReadError(Exception):
    """An AWS read that failed; the message names the call and AWS's error code."""


@dataclass(frozen=True)
class JobView:
    job_id: str
    name: str
    status: str
    status_reason: str = ""
    reasons: tuple[str, ...] = ()  # container / attempt reasons (CannotPullContainerError lands here)
    log_group: str = "/aws/batch/job"
    log_stream: str | None = None
    job_definition: str = ""
    started: bool = False  # the container ran (startedAt is set)


@dataclass(frozen=True)
class ComputeEnvironmentView:
    name: str
    state: str
    status: str
    status_reason: str
    spot: bool
    max_vcpus: int
    instance_types: tuple[str, ...] = ()


@dataclass(frozen=True)
class LambdaConcurrency:
    limit: int  # the account's concurrent executions (its quota)
    unreserved: int  # what no function has reserved


@dataclass(frozen=True)
class StateTest:
    """What Step Functions' TestState answered: the state's status (SUCCEEDED, FAILED, ...; INVALID when the
    definition itself was refused) and its error and cause."""

    status: str
    error: str = ""
    cause: str = ""


@dataclass(frozen=True)
class ExecutionView:
    status: str
    # (seconds since the execution started, event type, state name) for every state entered or exited.
    events: list[tuple[float, str, str]] = field(default_factory=list)


def _code(e: Exception) -> str:
    if isinstance(e, ClientError):
        return str(e.response.get("Error", {}).get("Code", "ClientError"))
    return type(e).__name__


class AwsAccount:
    def __init__(self, client: Callable[[str], Any], region: str) -> None:
        self._client = client
        self._clients: dict[str, Any] = {}
        self.region = region

    @classmethod
    def connect(cls, region: str | None = None) -> AwsAccount:
        """The caller's credentials and region (AWS_PROFILE, AWS_REGION, AWS_ENDPOINT_URL as boto3 reads them)."""
        session = boto3.session.Session(region_name=region)
        if not session.region_name:
            raise AccountReadError("no AWS region: pass --region or set AWS_REGION")
        return cls(session.client, session.region_name)

    def client(self, service: str) -> Any:
        if service not in self._clients:
            self._clients[service] = self._client(service)
        return self._clients[service]

    def _call(self, service: str, operation: str, missing: str | None = None, **kw: Any) -> Any:
        """The call's answer; None when it fails with the `missing` error code (the thing is not there). Any
        other failure is an AccountReadError naming the call and the code."""
        try:
            return getattr(self.client(service), operation)(**kw)
        except (ClientError, BotoCoreError) as e:
            if missing is not None and _code(e) == missing:
                return None
            raise AccountReadError(f"{service} {operation}: {_code(e)}: {e}") from None

    # --------------------------------------------------------------------------------- CloudFormation

    def stack_outputs(self, stack: str) -> dict[str, str]:
        stacks = self._call("cloudformation", "describe_stacks", StackName=stack)["Stacks"]
        return {o["OutputKey"]: o["OutputValue"] for o in stacks[0].get("Outputs", [])}

    def stack_resources(self, stack: str, resource_type: str) -> list[str]:
        """Physical ids of the stack's resources of one type, e.g. AWS::Batch::JobDefinition."""
        out: list[str] = []
        try:
            for page in self.client("cloudformation").get_paginator("list_stack_resources").paginate(
                    StackName=stack):
                out += [r["PhysicalResourceId"] for r in page.get("StackResourceSummaries", [])
                        if r.get("ResourceType") == resource_type and r.get("PhysicalResourceId")]
        except (ClientError, BotoCoreError) as e:
            raise AccountReadError(f"cloudformation list_stack_resources: {_code(e)}: {e}") from None
        return out

    # ------------------------------------------------------------------------------------- AWS Batch

    def jobs(self, queue: str, name_prefix: str) -> list[JobView]:
        """The queue's jobs whose name starts with `name_prefix` (the workflow names them `<batch>-<shard>`)."""
        ids: list[str] = []
        try:
            for page in self.client("batch").get_paginator("list_jobs").paginate(
                    jobQueue=queue, filters=[{"name": "JOB_NAME", "values": [f"{name_prefix}*"]}]):
                ids += [j["jobId"] for j in page.get("jobSummaryList", [])]
        except (ClientError, BotoCoreError) as e:
            raise AccountReadError(f"batch list_jobs: {_code(e)}: {e}") from None
        views: list[JobView] = []
        for start in range(0, len(ids), 100):
            for j in self._call("batch", "describe_jobs", jobs=ids[start:start + 100]).get("jobs", []):
                views.append(_job_view(j))
        return views

    def compute_environments(self, queue: str) -> list[ComputeEnvironmentView]:
        queues = self._call("batch", "describe_job_queues", jobQueues=[queue]).get("jobQueues", [])
        if not queues:
            raise AccountReadError(f"batch describe_job_queues: no job queue {queue}")
        order = sorted(queues[0].get("computeEnvironmentOrder", []), key=lambda c: c.get("order", 0))
        arns = [c["computeEnvironment"] for c in order]
        envs = self._call("batch", "describe_compute_environments", computeEnvironments=arns)
        by_arn = {e["computeEnvironmentArn"]: e for e in envs.get("computeEnvironments", [])}
        views = []
        for arn in arns:
            e = by_arn.get(arn)
            if e is None:
                continue
            resources = e.get("computeResources") or {}
            views.append(ComputeEnvironmentView(
                name=e.get("computeEnvironmentName", arn), state=e.get("state", ""), status=e.get("status", ""),
                status_reason=e.get("statusReason", ""),
                spot=resources.get("type") in ("SPOT", "FARGATE_SPOT"),
                max_vcpus=int(resources.get("maxvCpus", 0)),
                instance_types=tuple(resources.get("instanceTypes", [])),
            ))
        return views

    def job_definition_secrets(self, job_definition: str) -> dict[str, str]:
        """The secrets a job definition injects: environment name → Secrets Manager ARN (or name)."""
        defs = self._call("batch", "describe_job_definitions", jobDefinitions=[job_definition])
        found = defs.get("jobDefinitions", [])
        if not found:
            raise AccountReadError(f"batch describe_job_definitions: no job definition {job_definition}")
        latest = max(found, key=lambda d: d.get("revision", 0))
        props = latest.get("containerProperties") or {}
        if not props and latest.get("ecsProperties"):
            containers = latest["ecsProperties"].get("taskProperties", [{}])[0].get("containers", [])
            props = containers[0] if containers else {}
        return {s["name"]: s["valueFrom"] for s in props.get("secrets", [])}

    # ------------------------------------------------------------------------------ Step Functions

    def execution(self, state_machine_arn: str, name: str) -> ExecutionView | None:
        """The execution named after the batch, or None when it has not started (yet)."""
        # arn:aws:states:region:account:stateMachine:NAME → …:execution:NAME:<execution name>
        prefix, _, machine = state_machine_arn.rpartition(":stateMachine:")
        arn = f"{prefix}:execution:{machine}:{name}"
        described = self._call("stepfunctions", "describe_execution", missing="ExecutionDoesNotExist",
                               executionArn=arn)
        if described is None:
            return None
        started: datetime = described["startDate"]
        events: list[tuple[float, str, str]] = []
        try:
            pages = self.client("stepfunctions").get_paginator("get_execution_history").paginate(executionArn=arn)
            for page in pages:
                for ev in page.get("events", []):
                    details = ev.get("stateEnteredEventDetails") or ev.get("stateExitedEventDetails") or {}
                    if details.get("name"):
                        events.append(((ev["timestamp"] - started).total_seconds(), ev["type"], details["name"]))
        except (ClientError, BotoCoreError) as e:
            raise AccountReadError(f"stepfunctions get_execution_history: {_code(e)}: {e}") from None
        return ExecutionView(status=described["status"], events=events)

    def state_machine(self, arn: str) -> tuple[dict[str, Any], str]:
        """The deployed definition and the role the workflow runs as."""
        described = self._call("stepfunctions", "describe_state_machine", stateMachineArn=arn)
        return json.loads(described["definition"]), str(described["roleArn"])

    def test_state(self, state: dict[str, Any], role_arn: str, state_input: dict[str, Any]) -> StateTest:
        """Step Functions runs one state, as `role_arn`, on `state_input` (TestState): its integration's call is
        made for real. A definition Step Functions refuses comes back as status INVALID."""
        try:
            answer = self.client("stepfunctions").test_state(
                definition=json.dumps(state), roleArn=role_arn, input=json.dumps(state_input))
        except ClientError as e:
            if _code(e) == "InvalidDefinition":
                return StateTest("INVALID", "InvalidDefinition", str(e.response.get("Error", {}).get("Message", "")))
            raise AccountReadError(f"stepfunctions test_state: {_code(e)}: {e}") from None
        except BotoCoreError as e:
            raise AccountReadError(f"stepfunctions test_state: {_code(e)}: {e}") from None
        return StateTest(str(answer.get("status", "")), str(answer.get("error", "")), str(answer.get("cause", "")))

    # ------------------------------------------------------------------------- account prerequisites

    def service_quota(self, service_code: str, quota_code: str) -> float:
        quota = self._call("service-quotas", "get_service_quota", ServiceCode=service_code, QuotaCode=quota_code)
        return float(quota["Quota"]["Value"])

    def lambda_concurrency(self) -> LambdaConcurrency:
        limit = self._call("lambda", "get_account_settings")["AccountLimit"]
        return LambdaConcurrency(limit=int(limit["ConcurrentExecutions"]),
                                 unreserved=int(limit["UnreservedConcurrentExecutions"]))

    def role_exists(self, name: str) -> bool:
        return self._call("iam", "get_role", missing="NoSuchEntity", RoleName=name) is not None

    def ses_production_access(self) -> bool:
        return bool(self._call("sesv2", "get_account").get("ProductionAccessEnabled", False))

    def secret_exists(self, secret: str) -> bool:
        return self._call("secretsmanager", "describe_secret", missing="ResourceNotFoundException",
                          SecretId=secret) is not None

    def log_tail(self, group: str, stream: str, lines: int = 50) -> list[str]:
        events = self._call("logs", "get_log_events", logGroupName=group, logStreamName=stream, limit=lines,
                            startFromHead=False).get("events", [])
        return [str(e.get("message", "")) for e in events]


def _job_view(j: dict[str, Any]) -> JobView:
    container = j.get("container") or {}
    reasons = [container.get("reason", "")]
    for attempt in j.get("attempts", []):
        reasons += [attempt.get("statusReason", ""), (attempt.get("container") or {}).get("reason", "")]
    log_config = (container.get("logConfiguration") or {}).get("options") or {}
    return JobView(
        job_id=j["jobId"], name=j.get("jobName", ""), status=j.get("status", ""),
        status_reason=j.get("statusReason", ""), reasons=tuple(r for r in reasons if r),
        log_group=log_config.get("awslogs-group", "/aws/batch/job"), log_stream=container.get("logStreamName"),
        job_definition=j.get("jobDefinition", ""), started="startedAt" in j,
    )
