"""`nightbatch doctor --template`: before the first deploy, what the account must have for the stack `cdk synth`
wrote: Lambda's concurrency quota against the stack's reservations (its ReservedConcurrency output), the GPU vCPU
quotas of its compute environments, the EC2 Spot service-linked role.

moto has neither Lambda's GetAccountSettings nor EC2's quotas in Service Quotas: those two clients are botocore
Stubbers (tests/cli/doctor/test_doctor_aws.py's); IAM is moto's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from nightbatch.aws.account import AwsAccount
from nightbatch.cli.doctor.prerequisites import check_template
from nightbatch.cli.doctor.report import Check, Report
from nightbatch.cli.main import main
from tests.cli.doctor.test_doctor_aws import REGION, lambda_settings, spot_role

TEMPLATE: dict[str, Any] = {
    "Resources": {
        "GpuSpot": {"Type": "AWS::Batch::ComputeEnvironment", "Properties": {"ComputeResources": {
            "Type": "SPOT", "MaxvCpus": 16, "InstanceTypes": ["g6.xlarge", "g5.xlarge"]}}},
        "GpuOnDemand": {"Type": "AWS::Batch::ComputeEnvironment", "Properties": {"ComputeResources": {
            "Type": "EC2", "MaxvCpus": 16, "InstanceTypes": ["g6.xlarge", "g5.xlarge"]}}},
    },
    "Outputs": {"ReservedConcurrency": {"Value": "121"}, "ApiUrl": {"Value": {"Fn::Join": ["", ["x"]]}}},
}


def gpu_quotas(vcpus: float, reads: int) -> Any:
    client = boto3.client("service-quotas", region_name=REGION)
    stub = Stubber(client)
    for _ in range(reads):
        stub.add_response("get_service_quota", {"Quota": {"ServiceCode": "ec2", "Value": vcpus}})
    stub.activate()
    return client


def account(*, lambda_quota: int, unreserved: int, gpu_vcpus: float = 16, gpu_reads: int = 2) -> AwsAccount:
    stubbed = {"lambda": lambda_settings(lambda_quota, unreserved),
               "service-quotas": gpu_quotas(gpu_vcpus, gpu_reads)}
    return AwsAccount(lambda name: stubbed.get(name) or boto3.client(name, region_name=REGION), REGION)


def checked(tmp_path: Path, acct: AwsAccount, template: dict[str, Any] = TEMPLATE) -> dict[str, list[Check]]:
    path = tmp_path / "nightbatch-prod.template.json"
    path.write_text(json.dumps(template))
    report = Report(base_url="", stack=str(path))
    check_template(report, acct, path)
    out: dict[str, list[Check]] = {}
    for c in report.checks:
        out.setdefault(c.name, []).append(c)
    return out


def test_a_new_account_s_lambda_quota_cannot_hold_the_stack_and_the_doctor_says_both_ways_out(
        aws: None, tmp_path: Path) -> None:
    spot_role()
    [lam] = checked(tmp_path, account(lambda_quota=10, unreserved=10))["Lambda"]
    assert lam.status == "failed"
    assert lam.detail == ("Concurrent executions (L-B99A9384) is 10, 10 unreserved: the stack reserves 121 and "
                          "Lambda keeps 100 unreserved, 211 too many (CloudFormation refuses the functions)")
    assert "--service-code lambda --quota-code L-B99A9384 --desired-value 221 --region us-east-1" in lam.remedy
    assert "to at most 0 in all, set `concurrency.accountLimit` to 10" in lam.remedy


def test_other_functions_reservations_count_before_the_deploy(aws: None, tmp_path: Path) -> None:
    spot_role()
    found = checked(tmp_path, account(lambda_quota=1000, unreserved=150))
    [lam] = found["Lambda"]
    assert lam.status == "failed" and "71 too many" in lam.detail and "--desired-value 1071" in lam.remedy
    assert "at most 50 in all" in lam.remedy
    found = checked(tmp_path, account(lambda_quota=1000, unreserved=1000))
    assert [(c.status, c.detail) for c in found["Lambda"]] == [
        ("ok", "Concurrent executions (L-B99A9384) is 1000: the stack reserves 121, 879 left unreserved")]
    assert {c.status for cs in found.values() for c in cs} == {"ok"}
    assert [c.detail for c in found["GPU quota"]] == [
        "All G and VT Spot Instance Requests (L-3819A6DF): 16 vCPUs",
        "Running On-Demand G and VT instances (L-DB2E81BA): 16 vCPUs"]


def test_gpu_quotas_and_the_spot_role_are_checked_from_the_template(aws: None, tmp_path: Path) -> None:
    found = checked(tmp_path, account(lambda_quota=1000, unreserved=1000, gpu_vcpus=0))
    assert [c.status for c in found["GPU quota"]] == ["failed", "failed"]
    assert "one g5.xlarge needs 4: jobs stay RUNNABLE" in found["GPU quota"][0].detail
    [role] = found["Spot role"]
    assert role.status == "failed" and "create-service-linked-role" in role.remedy


def test_the_command_checks_a_template_without_a_key_or_a_probe(
        aws: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    spot_role()
    path = tmp_path / "t.json"
    path.write_text(json.dumps(TEMPLATE))
    monkeypatch.setattr(AwsAccount, "connect", classmethod(
        lambda cls, region=None: account(lambda_quota=10, unreserved=10)))
    monkeypatch.delenv("NIGHTBATCH_API_KEY", raising=False)
    assert main(["doctor", "--template", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"nightbatch doctor: before the first deploy (stack {path})" in out
    assert "✗ Lambda" in out and "L-B99A9384" in out and "1 problem(s) found" in out


@pytest.mark.parametrize(("lists", "status", "named"), [
    ({"read": ["users-data", "s3://lake/teams/{tenant}/"], "write": ["s3://out/all/"]}, "warn",
     "read users-data, write s3://out/all/"),
    ({"read": ["s3://lake/teams/{tenant}/"], "write": ["s3://out/{tenant}/"]}, "ok", "2 entries"),
])
def test_the_doctor_names_the_user_bucket_entries_every_tenant_shares(
        aws: None, tmp_path: Path, lists: dict[str, list[str]], status: str, named: str) -> None:
    """An allow-list entry without {tenant} lets every tenant read (or write) under it: the doctor says so."""
    template = {**TEMPLATE, "Outputs": {**TEMPLATE["Outputs"], "UserBuckets": {"Value": json.dumps(lists)}}}
    found = checked(tmp_path, account(lambda_quota=1000, unreserved=100), template)
    (check,) = found["user buckets"]
    assert check.status == status and named in check.detail
