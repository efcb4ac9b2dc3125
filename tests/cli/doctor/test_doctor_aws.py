"""The doctor's AWS reads (`--stack`) against moto: the stack's outputs, the queue's compute environments, the
jobs of a batch, the job definition's Hugging Face secret, the job's log, the Spot service-linked role and the
Notify step in the execution's history. Each problem gets its own remedy.

moto cannot model two reads: EC2's GPU quotas in Service Quotas and SES v2's GetAccount. Those two clients are
botocore Stubbers; every other call goes to moto (`mock_aws`, Batch without Docker).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from nightbatch.aws.account import AwsAccount
from nightbatch.cli.doctor.aws import StackWatcher
from nightbatch.cli.doctor.report import Probe, Report
from nightbatch.cli.main import main
from tests.cli.doctor.conftest import fake_credentials

REGION = "us-east-1"
STACK = "nightbatch-doctor-test"
SPOT_QUOTA = "L-3819A6DF"
BATCH_ID = "batch_0123456789abcdef0123456789abcdef"


@dataclass
class World:
    secret_arn: str
    stubs: dict[str, Any]

    def account(self, *, gpu_vcpus: float = 16, ses_production: bool = True, lambda_quota: int = 1000,
                unreserved: int = 879) -> AwsAccount:
        quotas = boto3.client("service-quotas", region_name=REGION)
        ses = boto3.client("sesv2", region_name=REGION)
        lambdas = lambda_settings(lambda_quota, unreserved)
        q, s = Stubber(quotas), Stubber(ses)
        q.add_response("get_service_quota", {"Quota": {"ServiceCode": "ec2", "QuotaCode": SPOT_QUOTA,
                                                       "QuotaName": "All G and VT Spot Instance Requests",
                                                       "Value": gpu_vcpus}},
                       {"ServiceCode": "ec2", "QuotaCode": SPOT_QUOTA})
        s.add_response("get_account", {"ProductionAccessEnabled": ses_production, "SendingEnabled": True})
        q.activate()
        s.activate()
        stubbed = {"service-quotas": quotas, "sesv2": ses, "lambda": lambdas}
        return AwsAccount(lambda name: stubbed.get(name) or boto3.client(name, region_name=REGION), REGION)

    def watcher(self, **kw: Any) -> StackWatcher:
        account = self.account(**kw)
        return StackWatcher(account, STACK, account.stack_outputs(STACK))


def lambda_settings(quota: int, unreserved: int) -> Any:
    """A Lambda client answering GetAccountSettings once (moto has no such call)."""
    client = boto3.client("lambda", region_name=REGION)
    stub = Stubber(client)
    stub.add_response("get_account_settings", {"AccountLimit": {
        "ConcurrentExecutions": quota, "UnreservedConcurrentExecutions": unreserved, "TotalCodeSize": 80530636800,
        "CodeSizeUnzipped": 262144000, "CodeSizeZipped": 52428800}, "AccountUsage": {"FunctionCount": 9}})
    stub.activate()
    return client


def _template(role: str, profile: str, subnet: str, sg: str, secret_arn: str) -> dict[str, Any]:
    return {
        "Resources": {
            "Spot": {"Type": "AWS::Batch::ComputeEnvironment", "Properties": {
                "Type": "MANAGED", "ServiceRole": role, "ComputeResources": {
                    "Type": "SPOT", "MinvCpus": 0, "MaxvCpus": 16, "InstanceTypes": ["g6.xlarge"],
                    "Subnets": [subnet], "SecurityGroupIds": [sg], "InstanceRole": profile}}},
            "Queue": {"Type": "AWS::Batch::JobQueue", "Properties": {
                "Priority": 1, "ComputeEnvironmentOrder": [{"Order": 1, "ComputeEnvironment": {"Ref": "Spot"}}]}},
            "Worker": {"Type": "AWS::Batch::JobDefinition", "Properties": {
                "Type": "container", "RetryStrategy": {"Attempts": 1}, "Parameters": {},
                "ContainerProperties": {"Image": "worker:latest", "Vcpus": 4, "Memory": 16384,
                                        "Secrets": [{"Name": "HF_TOKEN", "ValueFrom": secret_arn}]}}},
        },
        "Outputs": {
            "ApiUrl": {"Value": "https://abc123.execute-api.us-east-1.amazonaws.com/v1"},
            "ApiKeysSecret": {"Value": secret_arn},
            "SpotQueueArn": {"Value": {"Ref": "Queue"}},
            "StateMachineArn": {"Value": f"arn:aws:states:{REGION}:123456789012:stateMachine:{STACK}"},
            "ReservedConcurrency": {"Value": "121"},
        },
    }


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    fake_credentials(monkeypatch)
    with mock_aws(config={"batch": {"use_docker": False}, "stepfunctions": {"execute_state_machine": True}}):
        ec2, iam = boto3.client("ec2", region_name=REGION), boto3.client("iam", region_name=REGION)
        vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
        subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/24")["Subnet"]["SubnetId"]
        sg = ec2.create_security_group(GroupName="gpu", Description="gpu", VpcId=vpc)["GroupId"]
        role = iam.create_role(RoleName="batch", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
        profile = iam.create_instance_profile(InstanceProfileName="gpu")["InstanceProfile"]["Arn"]
        secret = boto3.client("secretsmanager", region_name=REGION).create_secret(
            Name="nightbatch/hf-token", SecretString="hf_test")["ARN"]
        boto3.client("cloudformation", region_name=REGION).create_stack(
            StackName=STACK, TemplateBody=json.dumps(_template(role, profile, subnet, sg, secret)))
        yield World(secret_arn=secret, stubs={})


def spot_role() -> None:
    """What `aws iam create-service-linked-role --aws-service-name spot.amazonaws.com` creates."""
    boto3.client("iam", region_name=REGION).create_role(
        RoleName="AWSServiceRoleForEC2Spot", Path="/aws-service-role/spot.amazonaws.com/",
        AssumeRolePolicyDocument=json.dumps({"Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                            "Principal": {"Service": "spot.amazonaws.com"}}]}))


def submit_job(watcher: StackWatcher, *, status: str, reason: str = "", started: bool = False) -> Any:
    """A shard job as the workflow submits it (`<batch>-<shard>`), left in `status` as AWS would show it."""
    from moto.batch.models import batch_backends

    batch = boto3.client("batch", region_name=REGION)
    definition = batch.describe_job_definitions()["jobDefinitions"][0]["jobDefinitionArn"]
    job_id = batch.submit_job(jobName=f"{BATCH_ID}-shard-00000", jobQueue=watcher.queues[0],
                              jobDefinition=definition)["jobId"]
    job = batch_backends["123456789012"][REGION]._jobs[job_id]
    job.status = status
    if status in ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING"):
        job.job_stopped, job.attempts = False, []
    if reason:  # ECS reports a failed start on the attempt's container; Batch says "Task failed to start"
        job.job_stopped_reason = "Task failed to start" if not started else "Essential container in task exited"
        job.attempts[-1]["container"]["reason"] = reason
    return job


def probe_in_progress() -> Probe:
    """A probe whose batch the API shows validated and in progress (what `api.observe` reports)."""
    probe = Probe(model="Qwen2.5-7B-Instruct", endpoint="/v1/chat/completions", batch_id=BATCH_ID,
                  status="in_progress")
    probe.reach("validate", 1.0)
    return probe


def checks(report: Report) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for c in report.checks:
        out.setdefault(c.name, []).append(c)
    return out


def test_a_healthy_account_passes_every_prerequisite(world: World) -> None:
    spot_role()
    watcher = world.watcher()
    assert watcher.outputs["ApiUrl"].endswith("/v1") and watcher.queues[0].startswith("arn:aws:batch:")
    report = Report(base_url=watcher.outputs["ApiUrl"], stack=STACK)
    watcher.preflight(report)
    found = checks(report)
    assert {c.status for c in report.checks} == {"ok"}, report.checks
    assert "up to 16 vCPUs of g6.xlarge" in found["compute"][0].detail
    assert "All G and VT Spot Instance Requests (L-3819A6DF): 16 vCPUs" in found["GPU quota"][0].detail
    assert found["HF token"][0].detail == f"HF_TOKEN from {world.secret_arn}"
    assert "production access" in found["SES"][0].detail
    assert found["Lambda"][0].detail == ("Concurrent executions (L-B99A9384) is 1000: the stack reserves 121, 879 "
                                         "left unreserved")


def preflight_check(watcher: StackWatcher, name: str) -> Any:
    """The first check called `name` of the doctor's preflight."""
    report = Report(base_url="", stack=STACK)
    watcher.preflight(report)
    return checks(report)[name][0]


def stuck_runnable(watcher: StackWatcher, *, at: float) -> tuple[Any, str, str]:
    """A shard job left RUNNABLE, observed `at` seconds into the probe: the probe, and the doctor's diagnosis of
    the STARTING phase (detail, remedy)."""
    submit_job(watcher, status="RUNNABLE")
    probe = probe_in_progress()
    watcher.observe(probe, at)
    detail, remedy = watcher.diagnose(probe, probe.phase("job STARTING")) or ("", "")
    return probe, detail, remedy


def test_gpu_quota_0_keeps_jobs_runnable_and_names_the_quota(world: World) -> None:
    spot_role()
    watcher = world.watcher(gpu_vcpus=0)
    quota = preflight_check(watcher, "GPU quota")
    assert quota.status == "failed" and "is 0 vCPUs; one g6.xlarge needs 4: jobs stay RUNNABLE" in quota.detail
    assert "--quota-code L-3819A6DF --desired-value 16" in quota.remedy

    probe, detail, remedy = stuck_runnable(watcher, at=12.0)
    assert [probe.phase(n).status for n in ("job queued", "job RUNNABLE", "job STARTING")] == ["ok", "ok", "pending"]
    assert "L-3819A6DF" in detail and "request-service-quota-increase" in remedy


def test_a_missing_spot_service_linked_role_is_named_with_its_command(world: World) -> None:
    watcher = world.watcher()
    role = preflight_check(watcher, "Spot role")
    assert role.status == "failed" and "AWSServiceRoleForEC2Spot is missing" in role.detail
    assert "aws iam create-service-linked-role --aws-service-name spot.amazonaws.com" in role.remedy
    _, detail, remedy = stuck_runnable(watcher, at=3.0)
    assert "AWSServiceRoleForEC2Spot" in detail and "create-service-linked-role" in remedy


def test_ses_sandbox_is_a_warning_with_the_way_out(world: World) -> None:
    spot_role()
    report = Report(base_url="", stack=STACK)
    world.watcher(ses_production=False).preflight(report)
    ses = checks(report)["SES"][0]
    assert ses.status == "warn" and "sandbox" in ses.detail and "production access" in ses.remedy
    assert report.passed  # e-mail is optional: the deployment still works


def test_an_image_pull_error_fails_the_job_phase_with_the_image_remedy(world: World) -> None:
    spot_role()
    watcher = world.watcher()
    submit_job(watcher, status="FAILED", reason="CannotPullContainerError: pull image manifest has been retried "
               "5 time(s): failed to resolve ref 123456789012.dkr.ecr.us-east-1.amazonaws.com/cdk-hnb659fds: not found")
    probe = probe_in_progress()
    watcher.observe(probe, 95.0)
    assert probe.phase("job STARTING").status == "ok"
    running = probe.phase("job RUNNING")
    assert running.status == "failed" and "CannotPullContainerError" in running.detail
    assert "could not pull the worker image" in running.remedy and "ECR" in running.remedy


def test_a_missing_hugging_face_secret_and_a_gated_model(world: World) -> None:
    spot_role()
    boto3.client("secretsmanager", region_name=REGION).delete_secret(SecretId=world.secret_arn,
                                                                     ForceDeleteWithoutRecovery=True)
    watcher = world.watcher()
    token = preflight_check(watcher, "HF token")
    assert token.status == "failed" and "does not exist" in token.detail
    assert "aws secretsmanager create-secret --name nightbatch/hf-token" in token.remedy

    # The container ran and huggingface_hub refused the download: the job's log says why.
    job = submit_job(watcher, status="FAILED", started=True)
    logs = boto3.client("logs", region_name=REGION)
    logs.create_log_group(logGroupName="/aws/batch/job")
    logs.create_log_stream(logGroupName="/aws/batch/job", logStreamName=job.log_stream_name)
    logs.put_log_events(logGroupName="/aws/batch/job", logStreamName=job.log_stream_name, logEvents=[
        {"timestamp": int(time.time() * 1000), "message": "loading Qwen/Qwen2.5-7B-Instruct"},
        {"timestamp": int(time.time() * 1000), "message": "huggingface_hub.errors.GatedRepoError: 401 Client "
                                                           "Error. Cannot access gated repo"}])
    probe = probe_in_progress()
    watcher.observe(probe, 140.0)
    loaded = probe.phase("model loaded")
    assert loaded.status == "failed" and "could not download the model" in loaded.detail
    assert "tokenSecret" in loaded.remedy


def test_the_notify_step_is_read_from_the_execution_history(world: World) -> None:
    sfn = boto3.client("stepfunctions", region_name=REGION)
    role = boto3.client("iam", region_name=REGION).create_role(RoleName="sfn", AssumeRolePolicyDocument="{}")
    sfn.create_state_machine(name=STACK, roleArn=role["Role"]["Arn"], definition=json.dumps({
        "StartAt": "Validate", "States": {"Validate": {"Type": "Pass", "Next": "Finalize"},
                                          "Finalize": {"Type": "Pass", "Next": "Notify"},
                                          "Notify": {"Type": "Pass", "End": True}}}))
    watcher = world.watcher()
    stuck = Probe(model="m", endpoint="/v1/completions", batch_id=BATCH_ID, status="validating")
    detail, remedy = watcher.diagnose(stuck, stuck.phase("validate")) or ("", "")
    assert detail == "no Step Functions execution for the batch" and "API Lambda's log" in remedy
    execution = sfn.start_execution(stateMachineArn=watcher.state_machine, name=BATCH_ID)["executionArn"]
    deadline = time.monotonic() + 30
    while sfn.describe_execution(executionArn=execution)["status"] == "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.1)
    probe = probe_in_progress()
    probe.status = "completed"
    watcher.observe(probe, 30.0)
    notified = probe.phase("notification")
    assert notified.status == "ok" and notified.at is not None and 0 <= notified.at < 30
    assert "Notify step finished" in notified.detail
    detail, _ = watcher.diagnose(stuck, stuck.phase("job queued")) or ("", "")
    assert detail == "no AWS Batch job yet; the execution is SUCCEEDED, last state Notify"
    # No job was seen for this batch: the job phases say so instead of failing.
    assert probe.phase("job queued").status == "skipped"


def test_the_command_reads_the_stack_and_says_where_the_key_is(world: World, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("NIGHTBATCH_API_KEY", raising=False)
    assert main(["doctor", "--stack", STACK]) == 1
    err = capsys.readouterr().err
    assert f"the stack's first key is in {world.secret_arn}" in err and "get-secret-value" in err
    assert main(["doctor", "--stack", "nightbatch-nope", "--api-key", "k"]) == 1
    assert "cloudformation describe_stacks: ValidationError" in capsys.readouterr().err


def test_a_disabled_compute_environment_is_why_jobs_wait(world: World) -> None:
    spot_role()
    batch = boto3.client("batch", region_name=REGION)
    name = batch.describe_compute_environments()["computeEnvironments"][0]["computeEnvironmentName"]
    batch.update_compute_environment(computeEnvironment=name, state="DISABLED")
    watcher = world.watcher()
    compute = preflight_check(watcher, "compute")
    assert compute.status == "failed" and f"Spot environment {name} is DISABLED" in compute.detail
    assert f"--compute-environment {name} --state ENABLED" in compute.remedy
    _, detail, _ = stuck_runnable(watcher, at=5.0)
    assert "is DISABLED" in detail
