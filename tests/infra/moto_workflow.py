"""The synthesized state machine on moto's Step Functions interpreter, with the real handlers in-process.

- moto 5.2.5 cannot run `batch:submitJob.sync` (getmoto/moto#10076): the ASL's PascalCase parameters reach
  botocore unconverted. `patch_task_normalisation` restores LocalStack's conversion (the fix of moto PR #10094),
  and lets ShareIdentifier / SchedulingPriorityOverride through (moto drops them; moto's Batch then ignores them,
  so `patch_batch` records them per job).
- `LambdaSimpleBackend.invoke` is replaced by a dispatcher that calls the handler named in the template.
- `BatchSimpleBackend._mark_job_as_finished` is replaced by a hook that runs the shard in-process with the job's
  environment (job definition environment plus the state machine's overrides), or fails it on request.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import boto3
import botocore
import botocore.session
import pytest

from tests.infra.asset_driver import Context
from tests.infra.cfn import of_type, one_of_type, resolve

ACCOUNT = "123456789012"
REGION = "us-east-1"
MOTO_CONFIG: Any = {
    "stepfunctions": {"execute_state_machine": True},
    "lambda": {"use_docker": False},
    "batch": {"use_docker": False},
}


def patch_task_normalisation(monkeypatch: pytest.MonkeyPatch) -> None:
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service import (
        StateTaskService,
    )

    session = botocore.session.get_session()
    models: dict[str, Any] = {}

    def operation(task: Any, boto_service_name: Any, service_action_name: Any) -> Any:
        """The botocore model of the operation a Step Functions task state calls."""
        service = task._get_boto_service_name(boto_service_name)
        action = task._get_boto_service_action(service_action_name)
        model = models.setdefault(service, session.get_service_model(service))
        return next((model.operation_model(n) for n in model.operation_names
                     if botocore.xform_name(n) == action), None)

    def normalise_parameters(self: Any, parameters: Any, boto_service_name: Any = None,
                             service_action_name: Any = None) -> None:
        op = operation(self, boto_service_name, service_action_name)
        if op is not None and op.input_shape is not None:
            self._to_boto_request(parameters, op.input_shape)

    def normalise_response(self: Any, response: Any, boto_service_name: Any = None,
                           service_action_name: Any = None) -> None:
        op = operation(self, boto_service_name, service_action_name)
        if op is not None and op.output_shape is not None:
            self._from_boto_response(response, op.output_shape)

    monkeypatch.setattr(StateTaskService, "_normalise_parameters", normalise_parameters)
    monkeypatch.setattr(StateTaskService, "_normalise_response", normalise_response)
    # moto 5.2.5's list of submitJob parameters Step Functions passes lacks the fair-share ones, which AWS's
    # Batch integration accepts; without them moto drops the fields silently.
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service import state_task_service_batch

    bindings = state_task_service_batch._SUPPORTED_API_PARAM_BINDINGS
    monkeypatch.setitem(bindings, "submitjob", {*bindings["submitjob"], "ShareIdentifier",
                                                "SchedulingPriorityOverride"})


def patch_backend_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    """moto looks its per-account backend up under one global lock, with a linear scan of every backend, on each
    request: a Map with many concurrent iterations spends its time queueing there. Known accounts skip it."""
    from moto.core.base_backend import BackendDict

    original = BackendDict._create_account_specific_backend

    def lookup(self: Any, account_id: str) -> None:
        if not dict.__contains__(self, account_id):
            original(self, account_id)

    monkeypatch.setattr(BackendDict, "_create_account_specific_backend", lookup)


@dataclass
class JobRecord:
    name: str
    env: dict[str, str]
    succeeded: bool = False
    error: str | None = None
    queue: str = ""  # "spot" / "on-demand" / "endpoint": the template queue the job was submitted to
    share: str | None = None  # SubmitJob's shareIdentifier
    priority: int | None = None  # SubmitJob's schedulingPriorityOverride
    status_reason: str | None = None

    @property
    def shard_id(self) -> str:
        return self.env.get("NIGHTBATCH_SHARD_ID", "")


@dataclass
class Deployment:
    """The template's resources created in moto, and what happened to them during a run."""

    template: dict[str, Any]
    refs: dict[str, str] = field(default_factory=dict)
    attrs: dict[tuple[str, str], str] = field(default_factory=dict)
    handlers: dict[str, str] = field(default_factory=dict)  # function name -> "module.attr"
    lambda_env: dict[str, dict[str, str]] = field(default_factory=dict)  # handler -> env
    state_machine_arn: str = ""
    invocations: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    jobs: list[JobRecord] = field(default_factory=list)
    failing_shards: set[str] = field(default_factory=set)  # shard ids whose jobs exit 1; "*" for all
    stand_ins: set[str] = field(default_factory=set)  # handlers not on this branch yet, answered with {}
    shard_runner: Callable[[dict[str, str]], None] | None = None
    # Before a job runs: a statusReason to fail it with instead (e.g. a Spot queue cancelling it after its
    # RUNNABLE bound), or None to run it. After a failed run: the statusReason Batch would report.
    refuse: Callable[[JobRecord], str | None] | None = None
    failure_reason: Callable[[JobRecord], str | None] | None = None
    queue_kinds: dict[str, str] = field(default_factory=dict)  # queue ARN -> "spot" / "on-demand"
    submitting: threading.local = field(default_factory=threading.local)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def render(self, node: Any) -> Any:
        return resolve(node, self.refs, lambda logical, attr: self.attrs[(logical, attr)])

    def invoked(self, step: str) -> list[dict[str, Any]]:
        return [payload for handler, payload in self.invocations if handler == f"functions.tasks.{step}.handler"]


def create_resources(template: dict[str, Any]) -> Deployment:
    """Create in moto what the tasks touch, named after the template's logical ids."""
    d = Deployment(template=template)
    s3 = boto3.client("s3", region_name=REGION)
    bucket_id, _ = one_of_type(template, "AWS::S3::Bucket")
    s3.create_bucket(Bucket="nb-data")
    d.refs[bucket_id] = "nb-data"
    d.attrs[(bucket_id, "Arn")] = "arn:aws:s3:::nb-data"

    table_id, table = one_of_type(template, "AWS::DynamoDB::GlobalTable")
    props = table["Properties"]
    boto3.client("dynamodb", region_name=REGION).create_table(
        TableName="nb-table", BillingMode="PAY_PER_REQUEST", KeySchema=props["KeySchema"],
        AttributeDefinitions=props["AttributeDefinitions"],
        GlobalSecondaryIndexes=[{k: g[k] for k in ("IndexName", "KeySchema", "Projection")}
                                for g in props["GlobalSecondaryIndexes"]],
    )
    d.refs[table_id] = "nb-table"
    d.attrs[(table_id, "Arn")] = f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/nb-table"

    topic_id, _ = one_of_type(template, "AWS::SNS::Topic")
    d.refs[topic_id] = boto3.client("sns", region_name=REGION).create_topic(Name="nb-topic")["TopicArn"]
    sqs = boto3.client("sqs", region_name=REGION)
    for queue_id in of_type(template, "AWS::SQS::Queue"):
        url = sqs.create_queue(QueueName=queue_id[:70])["QueueUrl"]
        d.refs[queue_id] = url
        d.attrs[(queue_id, "Arn")] = f"arn:aws:sqs:{REGION}:{ACCOUNT}:{queue_id[:70]}"
    kms = boto3.client("kms", region_name=REGION)
    for key_id in of_type(template, "AWS::KMS::Key"):
        key = kms.create_key(Description=key_id)["KeyMetadata"]
        d.refs[key_id] = key["KeyId"]
        d.attrs[(key_id, "Arn")] = key["Arn"]
    for secret_id in of_type(template, "AWS::SecretsManager::Secret"):
        d.refs[secret_id] = boto3.client("secretsmanager", region_name=REGION).create_secret(
            Name=secret_id, SecretString=f"test-secret-{secret_id}")["ARN"]
    for api_id in of_type(template, "AWS::ApiGatewayV2::Api"):
        d.refs[api_id] = "nbapi"

    iam = boto3.client("iam", region_name=REGION)
    role = iam.create_role(RoleName="nb-role", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    for role_id in of_type(template, "AWS::IAM::Role"):  # e.g. the SageMaker job role the workflow passes
        d.attrs[(role_id, "Arn")] = f"arn:aws:iam::{ACCOUNT}:role/{role_id[:64]}"
    batch = boto3.client("batch", region_name=REGION)
    ce = batch.create_compute_environment(computeEnvironmentName="nb-gpu", type="UNMANAGED", state="ENABLED",
                                          serviceRole=role)["computeEnvironmentArn"]
    for queue_id in of_type(template, "AWS::Batch::JobQueue"):
        arn = batch.create_job_queue(
            jobQueueName=f"nb-{queue_id}"[:120], state="ENABLED", priority=1,
            computeEnvironmentOrder=[{"order": 1, "computeEnvironment": ce}])["jobQueueArn"]
        d.attrs[(queue_id, "JobQueueArn")] = d.refs[queue_id] = arn
        d.queue_kinds[arn] = ("spot" if "Spot" in queue_id else "endpoint" if queue_id.startswith("EndpointRunner")
                              else "on-demand")

    functions = of_type(template, "AWS::Lambda::Function")
    for logical, fn in functions.items():
        d.attrs[(logical, "Arn")] = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{logical}"
        d.refs[logical] = logical
        d.handlers[logical] = fn["Properties"]["Handler"]
    machine_id, machine = one_of_type(template, "AWS::StepFunctions::StateMachine")
    d.state_machine_arn = f"arn:aws:states:{REGION}:{ACCOUNT}:stateMachine:nightbatch-test"
    d.refs[machine_id] = d.state_machine_arn

    for job_id, job in of_type(template, "AWS::Batch::JobDefinition").items():
        container = job["Properties"]["ContainerProperties"]
        env = [{"name": e["Name"], "value": str(d.render(e["Value"]))} for e in container["Environment"]]
        d.refs[job_id] = batch.register_job_definition(
            jobDefinitionName=f"nb-{job_id}"[:120], type="container",
            containerProperties={"image": "worker", "vcpus": 4, "memory": 14336, "environment": env},
        )["jobDefinitionArn"]

    for fn in functions.values():
        d.lambda_env[fn["Properties"]["Handler"]] = {
            k: resolve_secret_references(str(v))
            for k, v in d.render(fn["Properties"]["Environment"]["Variables"]).items()}
    boto3.client("stepfunctions", region_name=REGION).create_state_machine(
        name="nightbatch-test", roleArn=role, type="STANDARD",
        definition=d.render(machine["Properties"]["DefinitionString"]),
    )
    return d


_SECRET_REFERENCE = re.compile(r"\{\{resolve:secretsmanager:(?P<id>[^}]+?):SecretString:::\}\}")


def resolve_secret_references(value: str) -> str:
    """CloudFormation's `{{resolve:secretsmanager:…}}` dynamic references, as it resolves them at deploy."""
    client = boto3.client("secretsmanager", region_name=REGION)
    return _SECRET_REFERENCE.sub(lambda m: str(client.get_secret_value(SecretId=m["id"])["SecretString"]), value)


def patch_lambda(monkeypatch: pytest.MonkeyPatch, d: Deployment) -> None:
    from moto.awslambda_simple.models import LambdaSimpleBackend

    def invoke(self: Any, function_name: str, qualifier: Any, body: Any, headers: Any,
               response_headers: dict[str, str]) -> bytes:
        name = function_name.rsplit(":function:", 1)[-1].split(":")[0]
        handler_path = d.handlers[name]
        event = json.loads(body or b"{}")
        d.invocations.append((handler_path, event))
        module, _, attr = handler_path.rpartition(".")
        if importlib.util.find_spec(module) is None:
            d.stand_ins.add(handler_path)
            return b"{}"
        try:
            context = Context(name, request_id="moto-request", remaining_ms=900_000)  # a task Lambda's 15 minutes
            result = getattr(importlib.import_module(module), attr)(event, context)
        except Exception as exc:  # reported to Step Functions as an unhandled function error, like Lambda does
            response_headers["x-amz-function-error"] = "Unhandled"
            return json.dumps({"errorType": type(exc).__name__, "errorMessage": str(exc),
                               "stackTrace": traceback.format_exc().splitlines()}).encode()
        return json.dumps(result).encode()

    monkeypatch.setattr(LambdaSimpleBackend, "invoke", invoke)


def patch_batch(monkeypatch: pytest.MonkeyPatch, d: Deployment) -> None:
    from moto.batch.responses import BatchResponse
    from moto.batch_simple.models import BatchSimpleBackend

    # The handler of SubmitJob: `submitjob` up to moto 5.2.5, `submit_job` from 5.2.6.
    name = "submit_job" if hasattr(BatchResponse, "submit_job") else "submitjob"
    submit = getattr(BatchResponse, name)

    def submitjob(self: Any) -> str:
        # moto keeps neither field; batch_simple runs the job inside this call, on this thread.
        d.submitting.params = {"share": self._get_param("shareIdentifier"),
                               "priority": self._get_param("schedulingPriorityOverride")}
        return str(submit(self))

    def finish(self: Any, include_start_attempt: bool, job: Any) -> None:
        import datetime

        self.backend._jobs[job.job_id] = job
        job.job_started_at = datetime.datetime.now()
        job.log_stream_name = job._stream_name
        if include_start_attempt:
            job._start_attempt()
        env = {e["name"]: e["value"] for e in job._get_container_property("environment", [])}
        params = getattr(d.submitting, "params", {})
        record = JobRecord(name=job.job_name, env=env, queue=d.queue_kinds.get(job.job_queue.arn, ""),
                           share=params.get("share"), priority=params.get("priority"))
        with d.lock:
            d.jobs.append(record)
        try:
            refused = d.refuse(record) if d.refuse is not None else None
            if refused:
                record.status_reason = refused
                raise RuntimeError(f"not run: {refused}")
            if {"*", env.get("NIGHTBATCH_SHARD_ID")} & d.failing_shards:
                raise RuntimeError("simulated: the container exited 1")
            if d.shard_runner is not None:
                d.shard_runner(env)
            record.succeeded = True
        except Exception as exc:
            record.error = f"{type(exc).__name__}: {exc}"
            if record.status_reason is None and d.failure_reason is not None:
                record.status_reason = d.failure_reason(record)
        if record.status_reason:
            job.job_stopped_reason = record.status_reason
        job._mark_stopped(success=record.succeeded)

    monkeypatch.setattr(BatchResponse, name, submitjob)
    monkeypatch.setattr(BatchSimpleBackend, "_mark_job_as_finished", finish)


# Per-job variables: the state machine's overrides, Batch's own, and the worker's container-only path.
JOB_ONLY_ENV = {"NIGHTBATCH_BATCH_ID", "NIGHTBATCH_SHARD_ID", "NIGHTBATCH_BACKEND", "NIGHTBATCH_MODEL_CACHE",
                "AWS_BATCH_JOB_ID", "MANAGED_BY_AWS", "VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"}


def worker_in_process(monkeypatch: pytest.MonkeyPatch, *, engine: str) -> Callable[[dict[str, str]], None]:
    """Run a submitted job as the container would (`python -m gpu_worker`), on moto's thread, with `engine` (an endpoint
    runner's job with the model's endpoint engine)."""
    import asyncio.unix_events
    import os

    from gpu_worker import main as worker_main

    # The container's SIGTERM handling cannot be installed off the main thread, and has no place in a test.
    monkeypatch.setattr(asyncio.unix_events._UnixSelectorEventLoop, "add_signal_handler",
                        lambda self, sig, callback, *args: None)

    def run(env: dict[str, str]) -> None:
        shared = {k: v for k, v in env.items() if k not in JOB_ONLY_ENV}
        drift = {k for k, v in shared.items() if os.environ.get(k) != v}
        assert not drift, f"the job definition's environment differs from the Lambdas' in {drift}"
        args = ["--batch-id", env["NIGHTBATCH_BATCH_ID"], "--shard-id", env["NIGHTBATCH_SHARD_ID"]]
        if env.get("NIGHTBATCH_BACKEND") == "endpoint":
            # The endpoint runner's job: the model's endpoint engine, as the workflow tells its container (one such
            # job at a time: the variable is the process's).
            os.environ["NIGHTBATCH_BACKEND"] = "endpoint"
            try:
                code = worker_main.main(args)
            finally:
                del os.environ["NIGHTBATCH_BACKEND"]
        else:
            code = worker_main.main(["--engine", engine, *args])
        if code != 0:
            raise RuntimeError(f"the worker exited {code}")

    return run


def wait_for_execution(arn: str, timeout: float = 400.0) -> dict[str, Any]:
    """A bound for a hung execution, not a speed check: a loaded 2-core machine took over 90 s for two batches."""
    import time

    client = boto3.client("stepfunctions", region_name=REGION)
    deadline = time.monotonic() + timeout
    while True:
        execution = client.describe_execution(executionArn=arn)
        if execution["status"] != "RUNNING":
            return dict(execution)
        if time.monotonic() > deadline:
            raise AssertionError(f"execution still RUNNING after {timeout}s: {arn}")
        time.sleep(0.2)


def history(arn: str) -> list[dict[str, Any]]:
    client = boto3.client("stepfunctions", region_name=REGION)
    return list(client.get_execution_history(executionArn=arn, maxResults=1000)["events"])


def entered_states(arn: str) -> list[str]:
    return [e["stateEnteredEventDetails"]["name"] for e in history(arn) if "stateEnteredEventDetails" in e]


def fixture_environment(monkeypatch: pytest.MonkeyPatch, d: Deployment) -> Iterator[None]:
    """Every Lambda's template environment (they agree on shared names), as the process environment."""
    merged: dict[str, str] = {}
    for env in d.lambda_env.values():
        for name, value in env.items():
            assert merged.setdefault(name, value) == value, f"{name} differs between Lambdas"
    for name, value in merged.items():
        monkeypatch.setenv(name, value)
    yield
