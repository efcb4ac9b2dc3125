"""What an account must have for a nightbatch stack, checked before its first deploy (`--template`: the synthesized
template) and after it (`--stack`): Lambda's concurrency quota against what the stack reserves, the GPU vCPU quotas
of its compute environments, the EC2 Spot service-linked role; a SageMaker stack's training quotas are
sagemaker.py's. Each check that fails says what to do; what keeps jobs from starting is returned as (detail,
remedy), for the phase a probe then stalls in.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nightbatch import lambda_quota
from nightbatch.aws.account import (
    SPOT_SERVICE_LINKED_ROLE,
    AccountReadError,
    AwsAccount,
    ComputeEnvironmentView,
)
from nightbatch.cli.doctor.remedies import QUOTAS, gpu_vcpus, lambda_quota_remedy, quota_remedy, spot_role_missing
from nightbatch.cli.doctor.report import Check, Report
from nightbatch.cli.doctor.sharing import user_buckets

Blocked = list[tuple[str, str]]


def read_or_warn(report: Report, name: str, what: str, read: Callable[[], Any]) -> Any:
    """`read()`, or None with a warning naming `what` could not be read (a doctor never stops on one)."""
    try:
        return read()
    except AccountReadError as e:
        report.add(Check(name, "warn", f"could not read {what}: {e}"))
        return None


def lambda_concurrency(report: Report, account: AwsAccount, reserved: int | None, *, deployed: bool) -> None:
    """The account's Lambda quota against the stack's reservations (its `ReservedConcurrency` output). Before the
    first deploy they must fit in what is unreserved now, less the 100 Lambda keeps; once deployed they are in."""
    settings = read_or_warn(report, "Lambda", "the account's concurrency (lambda GetAccountSettings)",
                            account.lambda_concurrency)
    if settings is None:
        return
    quota = f"{lambda_quota.QUOTA_NAME} ({lambda_quota.QUOTA_CODE}) is {settings.limit}"
    if reserved is None:
        report.add(Check("Lambda", "ok", f"{quota}, {settings.unreserved} unreserved (the stack states no "
                                          f"{lambda_quota.STACK_OUTPUT}: a release before it)"))
        return
    room = settings.unreserved - lambda_quota.UNRESERVED_MINIMUM + (reserved if deployed else 0)
    if reserved > room:
        short = reserved - room
        report.add(Check(
            "Lambda", "failed",
            f"{quota}, {settings.unreserved} unreserved: the stack reserves {reserved} and Lambda keeps "
            f"{lambda_quota.UNRESERVED_MINIMUM} unreserved, {short} too many (CloudFormation refuses the functions)",
            lambda_quota_remedy(settings.limit + short, reserved - short, settings.limit, account.region)))
        return
    left = settings.unreserved - (0 if deployed else reserved)
    report.add(Check("Lambda", "ok", f"{quota}: the stack reserves {reserved}, {left} left unreserved"))


def gpu_quotas(report: Report, account: AwsAccount, environments: list[ComputeEnvironmentView]) -> Blocked:
    """Each environment's EC2 vCPU quota (per family and Spot/on-demand) against one of its instances. A quota too
    low for every environment keeps jobs RUNNABLE; with another environment usable it is a warning."""
    zero: list[Check] = []
    usable = 0
    for ce in environments:
        need = min((gpu_vcpus(t) for t in ce.instance_types), default=4)
        families = {("P" if t.startswith("p") else "G") for t in ce.instance_types} or {"G"}
        for family in sorted(families):
            code, name = QUOTAS[(family, ce.spot)]
            try:
                value = account.service_quota("ec2", code)
            except AccountReadError as e:
                report.add(Check("GPU quota", "warn", f"{name} ({code}): could not read: {e}"))
                usable += 1
                continue
            check = Check("GPU quota", "ok", f"{name} ({code}): {value:g} vCPUs")
            if value < need:
                check = Check("GPU quota", "failed", f"{name} ({code}) is {value:g} vCPUs; one "
                              f"{min(ce.instance_types, default='GPU instance')} needs {need}: jobs stay RUNNABLE",
                              quota_remedy(code, name, max(need, ce.max_vcpus), account.region))
                zero.append(check)
            else:
                usable += 1
            report.add(check)
    if zero and usable:  # another environment can still take the jobs: slower or dearer, not stuck
        for check in zero:
            check.status = "warn"
        return []
    return [(c.detail, c.remedy) for c in zero]


def spot_role(report: Report, account: AwsAccount) -> Blocked:
    exists = read_or_warn(report, "Spot role", "the role", lambda: account.role_exists(SPOT_SERVICE_LINKED_ROLE))
    if exists is None:
        return []
    if exists:
        report.add(Check("Spot role", "ok", SPOT_SERVICE_LINKED_ROLE))
        return []
    detail = f"{SPOT_SERVICE_LINKED_ROLE} is missing: the Spot environment cannot launch instances"
    report.add(Check("Spot role", "failed", detail, spot_role_missing()))
    return [(detail, spot_role_missing())]


# ------------------------------------------------------------------------------------ before the first deploy


def template_outputs(template: dict[str, Any]) -> dict[str, str]:
    """The outputs a synthesized template states literally (the ones the stack computes at synth)."""
    return {k: o["Value"] for k, o in template.get("Outputs", {}).items() if isinstance(o.get("Value"), str)}


def template_environments(template: dict[str, Any]) -> list[ComputeEnvironmentView]:
    """The AWS Batch compute environments a synthesized template will create, as the account will show them."""
    views = []
    for logical, resource in template.get("Resources", {}).items():
        if resource.get("Type") != "AWS::Batch::ComputeEnvironment":
            continue
        resources = resource.get("Properties", {}).get("ComputeResources") or {}
        views.append(ComputeEnvironmentView(
            name=logical, state="ENABLED", status="VALID", status_reason="",
            spot=resources.get("Type") in ("SPOT", "FARGATE_SPOT"), max_vcpus=int(resources.get("MaxvCpus", 0)),
            instance_types=tuple(t for t in resources.get("InstanceTypes", []) if isinstance(t, str))))
    return views


def check_template(report: Report, account: AwsAccount, path: Path) -> None:
    """Everything the account needs for the stack `cdk synth` wrote to `path`, before it is deployed."""
    from nightbatch.cli.doctor.sagemaker import SageMakerWatcher

    template = json.loads(path.read_text())
    outputs = template_outputs(template)
    report.add(Check("template", "ok", f"{path} in {account.region}"))
    reserved = outputs.get(lambda_quota.STACK_OUTPUT)
    lambda_concurrency(report, account, int(reserved) if reserved else None, deployed=False)
    environments = template_environments(template)
    gpu_quotas(report, account, environments)
    if any(ce.spot for ce in environments):
        spot_role(report, account)
    SageMakerWatcher(account, outputs).preflight(report)
    user_buckets(report, outputs)
