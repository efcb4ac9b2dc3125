"""SageMaker Training Jobs as a shard's second backend: what Capacity fills into the `createTrainingJob.sync` task.

The state machine's RunShardSageMaker state (infra/orchestration.py) holds what every job shares (image, entry,
role, volume, the worker's environment); Capacity supplies per attempt the job's name, instance type, managed
Spot and stopping condition:
- Spot: `EnableManagedSpotTraining` with `MaxWaitTimeInSeconds` = the shard's own work plus the batch's slack
  above the margin, so a Spot job that cannot finish in time ends by itself (`MaxWaitTimeExceeded`) and Capacity
  reruns it on-demand; `MaxRuntimeInSeconds` never exceeds it (the API requires MaxWait >= MaxRuntime).
- On-demand: `MaxPendingTimeInSeconds`, the twin of the Batch queue's RUNNABLE bound.
Names: 1-63 characters of `[a-zA-Z0-9](-*[a-zA-Z0-9])*`, unique forever in an account and region (a training
job cannot be deleted), hence the batch id without its `_`, the attempt and a random tail (a re-driven batch
counts its attempts from 1 again).
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

# SageMaker's bounds (botocore's CreateTrainingJob model).
MAX_RUNTIME_SECONDS = 28 * 24 * 3600
MIN_PENDING_SECONDS, MAX_PENDING_SECONDS = 1800, 2419200
JOB_NAME_RE = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
# Every job name starts so (a batch id with its `_` made `-`): the workflow's IAM is scoped to it.
JOB_NAME_PREFIX = "batch-"
# How a SageMaker attempt ends when Spot could not hold or place it, or the account's quota was reached
# (SecondaryStatus, or the API error of CreateTrainingJob).
SPOT_SHORTAGE = ("MaxWaitTimeExceeded", "Interrupted", "ResourceLimitExceeded", "CapacityError")
# A Batch attempt its queue could not place within its RUNNABLE bound (an EC2 quota of 0 looks the same).
BATCH_PLACEMENT_FAILURE = ("CAPACITY:", "MISCONFIGURATION:COMPUTE_ENVIRONMENT_MAX_RESOURCE")


def batch_jobs_prefix(batch_id: str) -> str:
    """What every training job name of the batch begins with (the doctor finds a batch's jobs by it)."""
    return batch_id.replace("_", "-")


def job_name(batch_id: str, shard_id: str, attempt: int) -> str:
    name = f"{batch_jobs_prefix(batch_id)}-{shard_id}-{attempt}-{secrets.token_hex(3)}".replace("_", "-")
    if not JOB_NAME_RE.match(name) or not name.startswith(JOB_NAME_PREFIX):
        raise ValueError(f"{name!r} is not a SageMaker training job name")
    return name


def stopping_condition(*, spot: bool, seconds_left: float, budget_seconds: float,
                       max_pending_seconds: int) -> dict[str, int]:
    """`budget_seconds`: how long this attempt may take, waiting for Spot included, before the batch is late."""
    runtime = int(max(60, min(MAX_RUNTIME_SECONDS, seconds_left)))
    if spot:
        wait = int(max(60, min(MAX_RUNTIME_SECONDS, budget_seconds)))
        return {"MaxRuntimeInSeconds": min(runtime, wait), "MaxWaitTimeInSeconds": wait}
    pending = max(MIN_PENDING_SECONDS, min(MAX_PENDING_SECONDS, max_pending_seconds))
    return {"MaxRuntimeInSeconds": runtime, "MaxPendingTimeInSeconds": pending}


def failure_reason(cause: dict[str, Any]) -> str | None:
    """A failed training job's description (the `.sync` task's Cause) as one line; None for other causes."""
    if "TrainingJobStatus" not in cause:
        return None
    secondary = str(cause.get("SecondaryStatus") or cause["TrainingJobStatus"])
    return f"{secondary}: {cause.get('FailureReason') or ''}".rstrip(": ")


def cause_of(error: dict[str, Any]) -> dict[str, Any]:
    try:
        cause = json.loads(error.get("Cause") or "{}")
    except ValueError:
        return {}
    return cause if isinstance(cause, dict) else {}
