"""The doctor's view of SageMaker Training Jobs (--stack on a `gpuBackend: sagemaker|both` stack): the training
quotas of the stack's ml.* instance types before the probes, the probe batch's training jobs while they run,
and a remedy for each failure a retry will not fix.

The stack names its instance types in the output `SageMakerInstanceTypes` (comma-separated ml.* types); a stack
without it runs nothing on SageMaker and this watcher stays silent. On a deployed stack it also proves which
unlisted CreateTrainingJob fields Step Functions accepts (sagemaker_fields.py). Jobs are found by the batch id's
hex in their name: the workflow names them `nb-<deployment>-<hex>-<shard>-<attempt>-<tail>` (SageMaker refuses
the `_` of a batch id), and 0.1.x named them `batch-<hex>-…`; the hex finds both.
"""

from __future__ import annotations

from nightbatch.aws.account import AccountReadError, AwsAccount
from nightbatch.aws.sagemaker_reads import TrainingJobView, account_training_jobs, account_training_quotas
from nightbatch.cli.doctor.remedies import (
    GATED_MODEL,
    HF_ERRORS,
    IMAGE_PULL,
    SAGEMAKER_CAPACITY,
    SAGEMAKER_LOG,
    SPOT_WAIT,
    sagemaker_quota_remedy,
)
from nightbatch.cli.doctor.report import JOB_PHASES, Check, Phase, Probe, Report
from nightbatch.cli.doctor.sagemaker_fields import prove
from nightbatch.pipeline.training_jobs import batch_jobs_marker
from nightbatch.wire import TERMINAL_STATUSES

OUTPUT = "SageMakerInstanceTypes"
# The first job phase (report.JOB_PHASES, named after AWS Batch's states) each secondary status proves reached:
# created = queued, waiting for an instance = RUNNABLE, the instance coming up = STARTING, the container = RUNNING.
REACHED = {"Starting": 2, "Pending": 2, "Interrupted": 2, "MaxWaitTimeExceeded": 2,
           "LaunchingMLInstances": 3, "PreparingTrainingStack": 3, "Downloading": 3, "DownloadingTrainingImage": 3,
           "Training": 4, "Uploading": 4, "Completed": 4, "Stopping": 4, "Stopped": 4, "MaxRuntimeExceeded": 4,
           "Restarting": 2, "Failed": 3}


def reached(job: TrainingJobView) -> int:
    seen = [REACHED.get(status, 1) for status, _ in job.transitions]
    step = max([1, REACHED.get(job.secondary_status, 1), *seen])
    if job.status == "Completed":
        return 4
    if job.status == "Failed" and not any(s in ("Training", "Uploading") for s, _ in job.transitions):
        return min(step, 3)  # failed before its container ran
    return step


def failure(job: TrainingJobView, region: str, codes: dict[str, str] | None = None) -> tuple[str, str] | None:
    """A failed or Spot-starved job, as (detail, remedy); `codes`: the quota code of each type, when read."""
    reason = job.failure_reason
    where = f"training job {job.name} ({job.instance_type})"
    if job.secondary_status == "MaxWaitTimeExceeded":
        return f"{where}: managed Spot waited past MaxWaitTimeInSeconds", SPOT_WAIT
    if job.status != "Failed":
        return None
    if "ResourceLimitExceeded" in reason or "quota" in reason.lower():
        suffix = "for spot training job usage" if job.spot else "for training job usage"
        code = (codes or {}).get(f"{job.instance_type} {suffix}", "")
        return f"{where}: {reason[:300]}", sagemaker_quota_remedy(code, f"{job.instance_type} {suffix}", region)
    if "InsufficientCapacity" in reason or "CapacityError" in reason:
        return f"{where}: {reason[:300]}", SAGEMAKER_CAPACITY
    if "image" in reason.lower() and ("pull" in reason.lower() or "not exist" in reason.lower()):
        return f"{where}: {reason[:300]}", IMAGE_PULL
    if HF_ERRORS.search(reason):
        return f"{where} could not download the model: {reason[:300]}", GATED_MODEL
    return f"{where} failed: {reason[:300] or 'no FailureReason'}", SAGEMAKER_LOG.format(job=job.name)


class SageMakerWatcher:
    def __init__(self, account: AwsAccount, outputs: dict[str, str], stack: str | None = None) -> None:
        self.account = account
        self.outputs = outputs
        self.stack = stack  # a deployed stack (--stack): its task's unlisted fields are proven too
        self.instance_types = [t.strip() for t in outputs.get(OUTPUT, "").split(",") if t.strip()]
        self.jobs: dict[str, list[TrainingJobView]] = {}
        self.blocked: list[tuple[str, str]] = []  # training quotas of 0 for every type
        self.usable: list[str] = []  # types with a quota above 0
        self.codes: dict[str, str] = {}  # quota name -> code, for the remedies

    def close(self) -> None:
        return None

    def preflight(self, report: Report) -> None:
        if not self.instance_types:
            return
        self._quotas(report)
        if self.stack:
            prove(report, self.account, self.outputs, self.stack)

    def _quotas(self, report: Report) -> None:
        try:
            quotas = account_training_quotas(self.account, self.instance_types)
        except AccountReadError as e:
            report.add(Check("SageMaker quota", "warn", f"could not read: {e}"))
            return
        zero: list[Check] = []
        self.codes = {q.name: q.code for q in quotas}
        for q in quotas:
            kind = "Spot" if q.spot else "on-demand"
            if q.value >= 1:
                report.add(Check("SageMaker quota", "ok", f"{q.name} ({q.code}): {q.value:g} ({kind})"))
                self.usable.append(q.instance_type)
            else:
                zero.append(report.add(Check(
                    "SageMaker quota", "failed", f"{q.name} ({q.code}) is 0: {kind} training jobs of "
                    f"{q.instance_type} fail with ResourceLimitExceeded",
                    sagemaker_quota_remedy(q.code, q.name, self.account.region))))
        for t in sorted(set(self.instance_types) - {q.instance_type for q in quotas}):
            report.add(Check("SageMaker quota", "warn", f"no quota named '{t} for training job usage' in "
                             f"{self.account.region}: is {t} a SageMaker training type here?"))
        if self.usable:  # another type or capacity can take the jobs: slower or dearer, not stuck
            for check in zero:
                check.status = "warn"
        else:
            self.blocked += [(c.detail, c.remedy) for c in zero]

    def observe(self, probe: Probe, at: float) -> None:
        if probe.batch_id is None or not self.instance_types or probe.status in ("validating", None):
            return
        try:
            jobs = self.jobs[probe.batch_id] = account_training_jobs(self.account, batch_jobs_marker(probe.batch_id))
        except AccountReadError as e:
            for name in JOB_PHASES:
                probe.skip(name, f"could not read the training jobs: {e}")
            return
        step = max((reached(j) for j in jobs), default=0)
        for name in JOB_PHASES[:step]:
            probe.reach(name, at, detail=f"SageMaker: {', '.join(j.name for j in jobs)}"[:100]
                        if name == "job queued" else "")
        for job in jobs:
            if (found := failure(job, self.account.region, self.codes)) is not None and job.status == "Failed":
                phase = probe.current()
                probe.fail(phase.name if phase else "first result", *found)
        if probe.status in TERMINAL_STATUSES and jobs:
            for name in JOB_PHASES:
                probe.skip(name, "the training job passed it between polls")

    def diagnose(self, probe: Probe, phase: Phase) -> tuple[str, str] | None:
        if probe.batch_id is None or phase.name not in (*JOB_PHASES, "model loaded", "first result"):
            return None
        jobs = self.jobs.get(probe.batch_id, [])
        for job in jobs:
            if (found := failure(job, self.account.region, self.codes)) is not None:
                return found
        waiting = [j for j in jobs if j.status == "InProgress" and reached(j) <= 2]
        if waiting:
            if self.blocked:
                return self.blocked[0]
            return (f"training job {waiting[0].name} is {waiting[0].secondary_status}: no {waiting[0].instance_type} "
                    "instance yet", SAGEMAKER_CAPACITY)
        running = [j for j in jobs if j.status == "InProgress" and reached(j) >= 3]
        if running and phase.name in ("model loaded", "first result"):
            return (f"training job {running[0].name} is {running[0].secondary_status} with no result yet",
                    SAGEMAKER_LOG.format(job=running[0].name))
        return None
