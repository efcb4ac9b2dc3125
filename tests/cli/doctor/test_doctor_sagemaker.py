"""The doctor's SageMaker reads (`--stack` on a `gpuBackend: sagemaker|both` stack): the training quotas of the
stack's ml.* types, and the probe batch's training jobs with a remedy for each failure.

The training jobs are moto's (`create_training_job`, then set to the states AWS reports: moto starts every job
`Completed`). moto has no `ListServiceQuotas` ("not implemented", checked on 5.2.5), so the quota listing is a
botocore Stubber answering in the API's own shape: a unit test of the doctor's parsing of that listing (quotas
found by name, applied values over defaults), not of AWS.
"""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from nightbatch.aws.account import AwsAccount
from nightbatch.cli.doctor.aws import StackWatcher
from nightbatch.cli.doctor.report import Probe, Report
from nightbatch.cli.doctor.sagemaker import SageMakerWatcher
from nightbatch.pipeline.training_jobs import batch_jobs_marker, job_name
from nightbatch.settings import DEFAULT_JOB_PREFIX

REGION = "us-east-1"
BATCH_ID = "batch_0123456789abcdef0123456789abcdef"
TYPES = "ml.g6e.xlarge,ml.g5.xlarge,ml.p5.48xlarge"


def _quota(name: str, code: str, value: float) -> dict[str, Any]:
    return {"ServiceCode": "sagemaker", "QuotaName": name, "QuotaCode": code, "Value": value}


APPLIED = [
    _quota("ml.g6e.xlarge for training job usage", "L-G6EXL0001", 2),
    _quota("ml.g6e.xlarge for spot training job usage", "L-G6EXL0002", 0),
    _quota("ml.g5.xlarge for endpoint usage", "L-G5XLEND01", 4),  # hosting, not training: ignored
    _quota("ml.g6.xlarge for training job usage", "L-G6XL00001", 8),  # a type the stack does not use
]
DEFAULTS = [
    _quota("ml.g5.xlarge for training job usage", "L-G5XL00001", 0),  # never applied: the default answers
    _quota("ml.g6e.xlarge for training job usage", "L-G6EXL0001", 0),  # applied above: that value wins
]


def account(applied: list[dict[str, Any]] = APPLIED, defaults: list[dict[str, Any]] = DEFAULTS) -> AwsAccount:
    quotas = boto3.client("service-quotas", region_name=REGION)
    stub = Stubber(quotas)
    # Two pages of applied quotas: the reader follows NextToken.
    stub.add_response("list_service_quotas", {"Quotas": applied[:2], "NextToken": "p2"}, {"ServiceCode": "sagemaker"})
    stub.add_response("list_service_quotas", {"Quotas": applied[2:]}, {"ServiceCode": "sagemaker", "NextToken": "p2"})
    stub.add_response("list_aws_default_service_quotas", {"Quotas": defaults}, {"ServiceCode": "sagemaker"})
    stub.activate()
    return AwsAccount(lambda name: quotas if name == "service-quotas" else boto3.client(name, region_name=REGION),
                      REGION)


def training_job(shard: str, *, status: str, secondary: str, transitions: list[str], reason: str = "",
                 spot: bool = False, instance_type: str = "ml.g6e.xlarge") -> str:
    """A shard's training job as the workflow names it, left where AWS would show it."""
    from moto.sagemaker.models import sagemaker_backends

    name = job_name(DEFAULT_JOB_PREFIX, BATCH_ID, shard, 1)
    iam = boto3.client("iam", region_name=REGION)
    try:
        role = iam.get_role(RoleName="sm-job")["Role"]["Arn"]
    except iam.exceptions.NoSuchEntityException:
        role = iam.create_role(RoleName="sm-job", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    boto3.client("sagemaker", region_name=REGION).create_training_job(
        TrainingJobName=name, RoleArn=role, EnableManagedSpotTraining=spot,
        AlgorithmSpecification={"TrainingImage": "worker:latest", "TrainingInputMode": "File"},
        OutputDataConfig={"S3OutputPath": "s3://b/out"},
        ResourceConfig={"InstanceType": instance_type, "InstanceCount": 1, "VolumeSizeInGB": 100},
        StoppingCondition={"MaxRuntimeInSeconds": 3600, **({"MaxWaitTimeInSeconds": 7200} if spot else {})})
    job = sagemaker_backends["123456789012"][REGION].training_jobs[name]
    job.training_job_status, job.secondary_status = status, secondary
    job.secondary_status_transitions = [{"Status": s, "StatusMessage": s} for s in transitions]
    job.failure_reason = reason or None
    return name


def probe() -> Probe:
    p = Probe(model="Qwen2.5-7B-Instruct", endpoint="/v1/chat/completions", batch_id=BATCH_ID, status="in_progress")
    p.reach("validate", 1.0)
    return p


def test_training_quotas_are_found_by_name_and_a_zero_one_is_named_with_its_request(aws: None) -> None:
    watcher = SageMakerWatcher(account(), {"SageMakerInstanceTypes": TYPES})
    report = Report(base_url="https://x/v1", stack="s")
    watcher.preflight(report)
    found = {c.detail.split(" (")[0].split(": ")[0]: c for c in report.checks}
    ok = found["ml.g6e.xlarge for training job usage"]
    assert ok.status == "ok" and "(L-G6EXL0001): 2 (on-demand)" in ok.detail
    # Zero, but another type can take the jobs: a warning, each with the exact request.
    spot, g5 = found["ml.g6e.xlarge for spot training job usage"], found["ml.g5.xlarge for training job usage"]
    assert spot.status == g5.status == "warn"
    assert "--service-code sagemaker --quota-code L-G5XL00001 --desired-value 1 --region us-east-1" in g5.remedy
    (missing,) = [c for c in report.checks if "ml.p5.48xlarge" in c.detail]
    assert missing.status == "warn" and "no quota named 'ml.p5.48xlarge for training job usage'" in missing.detail
    assert watcher.usable == ["ml.g6e.xlarge"] and not watcher.blocked


def test_every_training_quota_zero_blocks_and_a_waiting_job_is_blamed_on_it(aws: None) -> None:
    zero = [{**q, "Value": 0} for q in APPLIED]
    watcher = SageMakerWatcher(account(zero, []), {"SageMakerInstanceTypes": "ml.g6e.xlarge"})
    report = Report(base_url="https://x/v1", stack="s")
    watcher.preflight(report)
    assert {c.status for c in report.checks} == {"failed"} and len(watcher.blocked) == 2
    training_job("00000", status="InProgress", secondary="Starting", transitions=["Starting"])
    p = probe()
    watcher.observe(p, 5.0)
    assert [p.phase(n).status for n in ("job queued", "job RUNNABLE", "job STARTING")] == ["ok", "ok", "pending"]
    assert batch_jobs_marker(BATCH_ID) in p.phase("job queued").detail
    detail, remedy = watcher.diagnose(p, p.phase("job STARTING")) or ("", "")
    assert "is 0" in detail and "L-G6EXL0001" in remedy


def test_a_running_job_reaches_running_and_a_capacity_failure_gets_its_remedy(aws: None) -> None:
    watcher = SageMakerWatcher(account(), {"SageMakerInstanceTypes": TYPES})
    watcher.preflight(Report(base_url="https://x/v1"))
    training_job("00000", status="InProgress", secondary="Training",
                 transitions=["Starting", "Downloading", "Training"])
    p = probe()
    watcher.observe(p, 7.0)
    assert all(p.phase(n).status == "ok" for n in ("job queued", "job RUNNABLE", "job STARTING", "job RUNNING"))
    assert p.phase("model loaded").status == "pending"
    detail, remedy = watcher.diagnose(p, p.phase("model loaded")) or ("", "")
    assert "is Training with no result yet" in detail and "/aws/sagemaker/TrainingJobs" in remedy

    training_job("00001", status="Failed", secondary="Failed", transitions=["Starting"],
                 reason="CapacityError: Unable to provision requested ML compute capacity. Please retry using a "
                        "different ML instance type.")
    watcher.observe(p, 9.0)
    failed = p.phase("model loaded")
    assert failed.status == "failed" and "CapacityError" in failed.detail and "gpuBackend: both" in failed.remedy


@pytest.mark.parametrize(("reason", "secondary", "spot", "expect"), [
    ("AlgorithmError: huggingface_hub.errors.GatedRepoError: 401 Client Error", "Failed", False, "gated"),
    ("ResourceLimitExceeded: The account-level service limit 'ml.g6e.xlarge for spot training job usage' is 0",
     "Failed", True, "L-G6EXL0002"),
    ("", "MaxWaitTimeExceeded", True, "on-demand"),
    ("AlgorithmError: exit code 1", "Failed", False, "aws logs tail /aws/sagemaker/TrainingJobs"),
])
def test_failures_and_their_remedies(aws: None, reason: str, secondary: str, spot: bool, expect: str) -> None:
    watcher = SageMakerWatcher(account(), {"SageMakerInstanceTypes": TYPES})
    watcher.preflight(Report(base_url="https://x/v1"))
    status = "Stopped" if secondary == "MaxWaitTimeExceeded" else "Failed"
    training_job("00000", status=status, secondary=secondary, transitions=["Starting", secondary], reason=reason,
                 spot=spot)
    p = probe()
    watcher.observe(p, 3.0)
    detail, remedy = watcher.diagnose(p, p.phase("job STARTING")) or ("", "")
    assert expect in remedy, (detail, remedy)


def test_a_stack_without_sagemaker_types_reads_nothing_and_a_sagemaker_only_stack_needs_no_queue(aws: None) -> None:
    quiet = SageMakerWatcher(AwsAccount(lambda name: boto3.client(name, region_name=REGION), REGION), {})
    report = Report(base_url="https://x/v1")
    quiet.preflight(report)
    quiet.observe(probe(), 1.0)
    assert report.checks == [] and quiet.jobs == {}
    outputs = {"ApiUrl": "https://x/v1", "StateMachineArn": f"arn:aws:states:{REGION}:123456789012:stateMachine:s",
               "SageMakerInstanceTypes": "ml.g6e.xlarge"}
    ses = boto3.client("sesv2", region_name=REGION)  # moto has no SES v2 GetAccount (as in test_doctor_aws.py)
    ses_stub = Stubber(ses)
    ses_stub.add_response("get_account", {"ProductionAccessEnabled": True, "SendingEnabled": True})
    ses_stub.activate()
    stack = StackWatcher(AwsAccount(lambda name: ses if name == "sesv2" else boto3.client(name, region_name=REGION),
                                    REGION), "s", outputs)
    report = Report(base_url="https://x/v1", stack="s")
    stack.preflight(report)
    assert report.checks[0].name == "stack" and report.checks[0].status == "ok", report.checks[0]
    assert json.dumps(report.to_json())  # the report still serialises with SageMaker checks in it
