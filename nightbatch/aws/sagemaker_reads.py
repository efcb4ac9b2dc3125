"""Read-only SageMaker and Service Quotas calls: a training job's billable time (Finalize prices managed Spot by
it) and, for `nightbatch doctor --stack`, the probe batch's training jobs and the ml.* training quotas.

SageMaker names its training-job quotas "<ml type> for training job usage" (and "... for spot training job
usage"); their codes differ by account age and region, so they are found by listing the service's quotas, never
hard-coded.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from nightbatch.aws.account import AccountReadError, AwsAccount, _code

log = logging.getLogger("nightbatch.storage.sagemaker")

TRAINING_QUOTA = " for training job usage"
SPOT_TRAINING_QUOTA = " for spot training job usage"


@dataclass(frozen=True)
class TrainingJobView:
    name: str
    status: str  # InProgress | Completed | Failed | Stopping | Stopped
    secondary_status: str = ""  # Starting, Pending, Downloading, Training, Interrupted, MaxWaitTimeExceeded, ...
    failure_reason: str = ""
    instance_type: str = ""
    spot: bool = False
    training_seconds: float = 0.0
    billable_seconds: float = 0.0
    transitions: tuple[tuple[str, str], ...] = ()  # (secondary status, its message), oldest first


@dataclass(frozen=True)
class TrainingQuota:
    instance_type: str
    spot: bool
    code: str
    name: str
    value: float


def training_job_view(d: dict[str, Any]) -> TrainingJobView:
    """A DescribeTrainingJob answer, as the doctor and the cost read it."""
    resources = d.get("ResourceConfig") or {}
    return TrainingJobView(
        name=d.get("TrainingJobName", ""), status=d.get("TrainingJobStatus", ""),
        secondary_status=d.get("SecondaryStatus", ""), failure_reason=d.get("FailureReason", ""),
        instance_type=resources.get("InstanceType", ""), spot=bool(d.get("EnableManagedSpotTraining")),
        training_seconds=float(d.get("TrainingTimeInSeconds") or 0),
        billable_seconds=float(d.get("BillableTimeInSeconds") or 0),
        transitions=tuple((t.get("Status", ""), t.get("StatusMessage", ""))
                          for t in d.get("SecondaryStatusTransitions") or []),
    )


def training_jobs(client: Any, name_contains: str) -> list[TrainingJobView]:
    """Every training job whose name contains `name_contains` (the workflow names them after the batch)."""
    names: list[str] = []
    for page in client.get_paginator("list_training_jobs").paginate(NameContains=name_contains):
        names += [s["TrainingJobName"] for s in page.get("TrainingJobSummaries", [])]
    return [training_job_view(client.describe_training_job(TrainingJobName=n)) for n in sorted(names)]


def billing(client: Any, names: Iterable[str]) -> dict[str, tuple[float, float]]:
    """(TrainingTimeInSeconds, BillableTimeInSeconds) of each job that says; a job that cannot be read is left
    out (the cost then assumes the configured saving) rather than failing Finalize."""
    out: dict[str, tuple[float, float]] = {}
    for name in names:
        try:
            view = training_job_view(client.describe_training_job(TrainingJobName=name))
        except (ClientError, BotoCoreError) as e:
            log.warning("billable time of training job %s not read: %s", name, e)
            continue
        if view.training_seconds > 0:
            out[name] = (view.training_seconds, view.billable_seconds)
    return out


def training_quotas(client: Any, instance_types: Iterable[str]) -> list[TrainingQuota]:
    """The applied (else default) training-job quotas of these ml.* types, on-demand and Spot. A type with no
    quota listed is absent from the answer."""
    wanted = set(instance_types)
    found: dict[tuple[str, bool], TrainingQuota] = {}
    for listing, default in (("list_service_quotas", False), ("list_aws_default_service_quotas", True)):
        try:
            pages = client.get_paginator(listing).paginate(ServiceCode="sagemaker")
            for page in pages:
                for q in page.get("Quotas", []):
                    # Applied values are listed first; a default fills in only a quota never applied.
                    if (quota := _training_quota(q, wanted)) is not None:
                        found.setdefault((quota.instance_type, quota.spot), quota)
        except ClientError as e:
            if not default:
                raise
            log.warning("default SageMaker quotas not read: %s", e)
    return sorted(found.values(), key=lambda q: (q.instance_type, q.spot))


def _training_quota(q: dict[str, Any], wanted: set[str]) -> TrainingQuota | None:
    name = str(q.get("QuotaName", ""))
    for suffix, spot in ((SPOT_TRAINING_QUOTA, True), (TRAINING_QUOTA, False)):
        if name.endswith(suffix):
            instance_type = name[: -len(suffix)].strip()
            if instance_type in wanted:
                return TrainingQuota(instance_type=instance_type, spot=spot, code=str(q.get("QuotaCode", "")),
                                     name=name, value=float(q.get("Value", 0.0)))
    return None


# -- the doctor's reads, through its account (errors become AccountReadError, like every other doctor read) -----


def account_training_jobs(account: AwsAccount, name_contains: str) -> list[TrainingJobView]:
    try:
        return training_jobs(account.client("sagemaker"), name_contains)
    except (ClientError, BotoCoreError) as e:
        raise AccountReadError(f"sagemaker list_training_jobs/describe_training_job: {_code(e)}: {e}") from None


def account_training_quotas(account: AwsAccount, instance_types: Iterable[str]) -> list[TrainingQuota]:
    try:
        return training_quotas(account.client("service-quotas"), instance_types)
    except (ClientError, BotoCoreError) as e:
        raise AccountReadError(f"service-quotas list_service_quotas sagemaker: {_code(e)}: {e}") from None
