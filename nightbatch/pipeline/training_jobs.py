"""SageMaker Training Jobs as a shard's second backend: what Capacity fills into the `createTrainingJob.sync` task.

The state machine's RunShardSageMaker state (infra/orchestration.py) holds what every job shares (image, entry,
role, volume, the worker's environment); Capacity supplies per attempt the job's name, instance type, managed
Spot and stopping condition:
- Spot: `EnableManagedSpotTraining` with `MaxWaitTimeInSeconds` = the shard's own work plus the batch's slack
  above the margin, so a Spot job that cannot finish in time ends by itself (`MaxWaitTimeExceeded`) and Capacity
  reruns it on-demand; `MaxRuntimeInSeconds` never exceeds it (the API requires MaxWait >= MaxRuntime).
- On-demand: `MaxPendingTimeInSeconds`, the twin of the Batch queue's RUNNABLE bound, when the deployment sends it
  (below); without it an on-demand job SageMaker cannot place fails (CapacityError) and Capacity retries it.
Three CreateTrainingJob fields are not in the Step Functions documentation's list for `createTrainingJob.sync`,
whose parameters Step Functions checks against its own list (a refused fixed field fails the deploy; a refused
run-time one fails every shard with States.Runtime, which no Catch catches). Each is sent only when the deployment
turns it on (cdk.json `sagemakerFields`), after `nightbatch doctor --stack` proved it in the account:
`ContainerEntrypoint` (without it SageMaker runs the image's ENTRYPOINT with the argument `train`, which the worker
accepts), `RetryStrategy` (SageMaker's retry of its own internal errors; without it Capacity retries the shard) and
`MaxPendingTimeInSeconds`.
Names: 1-63 characters of `[a-zA-Z0-9](-*[a-zA-Z0-9])*`, unique forever in an account and region (a training
job cannot be deleted): the deployment's prefix (`nb-<8 hex>-`, from its stack name), the batch id's hex, the
shard, the attempt and a random tail (a re-driven batch counts its attempts from 1 again). The prefix is the
deployment's own, not `batch-` (which other workloads use too): the workflow's IAM and the sweeper's stops are
scoped to it, so they never reach another workload's or another deployment's jobs.
A quota refusal (`ResourceLimitExceeded`) is neither a Spot shortage nor a failure: the account runs as many
jobs of the type as it may already, so Capacity waits for one to end (nightbatch/pipeline/capacity.py).
"""

from __future__ import annotations

import copy
import hashlib
import re
import secrets
from collections.abc import Iterable
from typing import Any

from nightbatch.settings import JOB_PREFIX_RE

# The fields above, each sent only when the deployment turns it on.
UNLISTED_FIELDS = ("ContainerEntrypoint", "RetryStrategy", "MaxPendingTimeInSeconds")
# The stack output naming those it sends ("none": none of them).
SAGEMAKER_FIELDS_OUTPUT = "SageMakerFields"
# The worker image's ENTRYPOINT (gpu_worker/Dockerfile), named again for SageMaker.
WORKER_ENTRYPOINT = ("python3", "-m", "gpu_worker")
# Retries of SageMaker's own internal errors only; anything else comes back to Capacity.
RETRY_ATTEMPTS = 2
# SageMaker's bounds (botocore's CreateTrainingJob model).
MAX_RUNTIME_SECONDS = 28 * 24 * 3600
MIN_PENDING_SECONDS, MAX_PENDING_SECONDS = 1800, 2419200
JOB_NAME_RE = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
MAX_JOB_NAME = 63  # characters, dashes included (the pattern counts only the others)
# How a SageMaker attempt ends when Spot could not hold or place it (SecondaryStatus / FailureReason).
SPOT_SHORTAGE = ("MaxWaitTimeExceeded", "Interrupted", "CapacityError")
# CreateTrainingJob refused for the account's quota of the type: Step Functions names the API error
# `SageMaker.ResourceLimitExceededException` (or a generic `SageMaker.AmazonSageMakerException` whose Cause
# says so).
QUOTA_REFUSAL = "ResourceLimitExceeded"
# A Batch attempt its queue could not place within its RUNNABLE bound (an EC2 quota of 0 looks the same).
BATCH_PLACEMENT_FAILURE = ("CAPACITY:", "MISCONFIGURATION:COMPUTE_ENVIRONMENT_MAX_RESOURCE")


def deployment_job_prefix(deployment: str) -> str:
    """The job-name prefix of the deployment named `deployment` (its stack name, unique in an account and
    region, where job names live)."""
    return f"nb-{hashlib.sha256(deployment.encode()).hexdigest()[:8]}-"


def batch_jobs_marker(batch_id: str) -> str:
    """What every training job name of the batch contains, whatever its prefix: the batch id's hex. The doctor
    finds a batch's jobs by it, those 0.1.x named `batch-<hex>-…` included."""
    return batch_id.removeprefix("batch_").replace("_", "-")


def job_name(prefix: str, batch_id: str, shard_id: str, attempt: int) -> str:
    name = f"{prefix}{batch_jobs_marker(batch_id)}-{shard_id}-{attempt}-{secrets.token_hex(3)}".replace("_", "-")
    if len(name) > MAX_JOB_NAME or not JOB_NAME_RE.fullmatch(name) or not JOB_PREFIX_RE.fullmatch(prefix):
        raise ValueError(f"{name!r} is not a SageMaker training job name")
    return name


def batch_of_job(name: str, prefix: str) -> str | None:
    """The batch id a job of this deployment (named by `job_name`) runs a shard of; None for another's name."""
    if not name.startswith(prefix):
        return None
    marker = name[len(prefix):].split("-", 1)[0]
    return f"batch_{marker}" if re.fullmatch(r"[0-9a-f]{32}", marker) else None


def is_quota_refusal(error_name: str, cause: str) -> bool:
    """A `.sync` task's error that is CreateTrainingJob's quota refusal."""
    return error_name.startswith("SageMaker.") and (QUOTA_REFUSAL in error_name or QUOTA_REFUSAL in cause)


def stopping_condition(*, spot: bool, seconds_left: float, budget_seconds: float,
                       max_pending_seconds: int) -> dict[str, int]:
    """`budget_seconds`: how long this attempt may take, waiting for Spot included, before the batch is late.
    `max_pending_seconds` 0: MaxPendingTimeInSeconds is not sent (the deployment has not turned it on)."""
    runtime = int(max(60, min(MAX_RUNTIME_SECONDS, seconds_left)))
    if spot:
        wait = int(max(60, min(MAX_RUNTIME_SECONDS, budget_seconds)))
        return {"MaxRuntimeInSeconds": min(runtime, wait), "MaxWaitTimeInSeconds": wait}
    if max_pending_seconds <= 0:
        return {"MaxRuntimeInSeconds": runtime}
    pending = max(MIN_PENDING_SECONDS, min(MAX_PENDING_SECONDS, max_pending_seconds))
    return {"MaxRuntimeInSeconds": runtime, "MaxPendingTimeInSeconds": pending}


def with_fields(parameters: dict[str, Any], fields: Iterable[str]) -> dict[str, Any]:
    """The `.sync` task's fixed Parameters with those of the unlisted `fields` that are fixed, and without the
    others (MaxPendingTimeInSeconds is Capacity's, at run time: `stopping_condition`)."""
    unknown = set(fields) - set(UNLISTED_FIELDS)
    if unknown:
        raise ValueError(f"{sorted(unknown)} are not among {UNLISTED_FIELDS}")
    out = copy.deepcopy(parameters)
    algorithm = out.setdefault("AlgorithmSpecification", {})
    algorithm.pop("ContainerEntrypoint", None)
    out.pop("RetryStrategy", None)
    if "ContainerEntrypoint" in fields:
        algorithm["ContainerEntrypoint"] = list(WORKER_ENTRYPOINT)
    if "RetryStrategy" in fields:
        out["RetryStrategy"] = {"MaximumRetryAttempts": RETRY_ATTEMPTS}
    return out


def failure_reason(cause: dict[str, Any]) -> str | None:
    """A failed training job's description (the `.sync` task's Cause) as one line; None for other causes."""
    if "TrainingJobStatus" not in cause:
        return None
    secondary = str(cause.get("SecondaryStatus") or cause["TrainingJobStatus"])
    return f"{secondary}: {cause.get('FailureReason') or ''}".rstrip(": ")
