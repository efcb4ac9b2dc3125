"""The doctor's view of the AWS account behind a stack (--stack): prerequisites before the probes, the AWS Batch
job phases and the Notify step while they run, and the specific reason when a phase stalls."""

from __future__ import annotations

from functools import partial

from nightbatch import lambda_quota
from nightbatch.aws.account import AccountReadError, AwsAccount, ComputeEnvironmentView, JobView
from nightbatch.cli.doctor.prerequisites import gpu_quotas, lambda_concurrency, read_or_warn, spot_role
from nightbatch.cli.doctor.remedies import (
    GATED_MODEL,
    HF_ERRORS,
    HF_TOKEN_ENV,
    IMAGE_PULL,
    SECRET_PULL,
    hf_secret_missing,
    ses_sandbox,
    spot_role_missing,
)
from nightbatch.cli.doctor.report import JOB_PHASES, Check, Phase, Probe, Report
from nightbatch.cli.doctor.sharing import user_buckets
from nightbatch.wire import TERMINAL_STATUSES

# The first job phase each AWS Batch status proves reached.
REACHED = {"SUBMITTED": 1, "PENDING": 1, "RUNNABLE": 2, "STARTING": 3, "RUNNING": 4, "SUCCEEDED": 4}


def _reached(job: JobView) -> int:
    if job.status == "FAILED":  # failed while starting (image pull, secrets) or after its container ran
        reasons = " ".join([job.status_reason, *job.reasons])
        failed_to_start = any(r in reasons for r in ("CannotPullContainerError", "ResourceInitializationError",
                                                     "CannotStartContainerError"))
        return 4 if job.started and not failed_to_start else 3
    return REACHED.get(job.status, 0)


QUEUE_OUTPUTS = ("SpotQueueArn", "OnDemandQueueArn")


class StackWatcher:
    def __init__(self, account: AwsAccount, stack: str, outputs: dict[str, str]) -> None:
        self.account = account
        self.stack = stack
        self.outputs = outputs
        # The stack's AWS Batch queues (infra/stack.py outputs them by capacity; none on a SageMaker-only stack).
        self.queues = [outputs[k] for k in QUEUE_OUTPUTS if outputs.get(k)]
        self.state_machine = outputs.get("StateMachineArn", "")
        self.environments: list[ComputeEnvironmentView] = []
        self.blocked: list[tuple[str, str]] = []  # (detail, remedy) of prerequisites that keep jobs RUNNABLE
        self.jobs: dict[str, list[JobView]] = {}

    @classmethod
    def open(cls, stack: str, *, region: str | None = None) -> StackWatcher:
        account = AwsAccount.connect(region)
        return cls(account, stack, account.stack_outputs(stack))

    def close(self) -> None:
        return None

    # ------------------------------------------------------------------------------------ preflight

    def preflight(self, report: Report) -> None:
        # A SageMaker-only stack (gpuBackend: sagemaker) has no AWS Batch queue; it names its ml.* types instead.
        missing = [k for k in ("ApiUrl", "StateMachineArn") if k not in self.outputs]
        if not self.queues and "SageMakerInstanceTypes" not in self.outputs:
            missing.append(" or ".join(QUEUE_OUTPUTS))
        report.add(Check("stack", "failed" if missing else "ok",
                         f"{self.stack} in {self.account.region}" + (f"; no output {', '.join(missing)}"
                                                                     if missing else ""),
                         "is this a nightbatch stack? `cdk deploy` prints its outputs" if missing else ""))
        reserved = self.outputs.get(lambda_quota.STACK_OUTPUT)
        lambda_concurrency(report, self.account, int(reserved) if reserved else None, deployed=True)
        if self.queues:
            self._compute(report)
        self._hf_token(report)
        self._ses(report)
        user_buckets(report, self.outputs)

    def _compute(self, report: Report) -> None:
        try:
            # A compute environment behind both queues is reported once.
            found = {ce.name: ce for q in self.queues for ce in self.account.compute_environments(q)}
            self.environments = list(found.values())
        except AccountReadError as e:
            report.add(Check("compute", "warn", f"could not read: {e}"))
            return
        for ce in self.environments:
            kind = "Spot" if ce.spot else "on-demand"
            if ce.state != "ENABLED" or ce.status == "INVALID":
                detail = f"{kind} environment {ce.name} is {ce.state}/{ce.status}: {ce.status_reason}".rstrip(": ")
                remedy = ("fix what statusReason names, then `aws batch update-compute-environment "
                          f"--compute-environment {ce.name} --state ENABLED`")
                reason = ce.status_reason.lower()
                if ce.spot and ("servicelinkedrole" in reason or ("spot" in reason and "role" in reason)):
                    remedy = spot_role_missing()
                report.add(Check("compute", "failed", detail, remedy))
                self.blocked.append((detail, remedy))
            else:
                types = ", ".join(ce.instance_types) or "any"
                report.add(Check("compute", "ok", f"{kind} environment {ce.name}: up to {ce.max_vcpus} vCPUs of "
                                                  f"{types}"))
        self.blocked += gpu_quotas(report, self.account, self.environments)
        if any(ce.spot for ce in self.environments):
            self.blocked += spot_role(report, self.account)

    def _hf_token(self, report: Report) -> None:
        """Every job definition of the stack (one per model, or one for all) that injects HF_TOKEN: does its
        secret exist? ECS refuses to start a job whose secret is missing."""
        try:
            definitions = self.account.stack_resources(self.stack, "AWS::Batch::JobDefinition")
            secrets = {s for d in definitions if (s := self.account.job_definition_secrets(d).get(HF_TOKEN_ENV))}
        except AccountReadError as e:
            report.add(Check("HF token", "warn", f"could not read the job definition: {e}"))
            return
        if not secrets:
            report.add(Check("HF token", "ok", "none configured: public models only (gated ones fail to download)"))
        for secret in sorted(secrets):
            exists = read_or_warn(report, "HF token", secret, partial(self.account.secret_exists, secret))
            if exists is None:
                continue
            if exists:
                report.add(Check("HF token", "ok", f"{HF_TOKEN_ENV} from {secret}"))
            else:
                report.add(Check("HF token", "failed", f"the secret {secret} does not exist: jobs fail to start",
                                 hf_secret_missing(secret)))

    def _ses(self, report: Report) -> None:
        try:
            production = self.account.ses_production_access()
        except AccountReadError as e:
            report.add(Check("SES", "skipped", f"could not read the SES account: {e}"))
            return
        if production:
            report.add(Check("SES", "ok", "production access: batch e-mails reach any allowed address"))
        else:
            report.add(Check("SES", "warn", "sandbox: batch e-mails reach only verified addresses",
                             ses_sandbox(self.account.region)))

    # ----------------------------------------------------------------------------------- the probes

    def observe(self, probe: Probe, at: float) -> None:
        if probe.batch_id is None:
            return
        if self.queues and probe.status not in ("validating", "failed"):
            try:
                jobs = self.jobs[probe.batch_id] = [j for q in self.queues
                                                    for j in self.account.jobs(q, f"{probe.batch_id}-")]
            except AccountReadError as e:
                for name in JOB_PHASES:
                    probe.skip(name, f"could not read the jobs: {e}")
                jobs = []
            step = max((_reached(j) for j in jobs), default=0)
            for name in JOB_PHASES[:step]:
                probe.reach(name, at, detail=self._job_detail(jobs, name))
            for job in jobs:
                if job.status == "FAILED" and (cause := self._failure(job)) is not None:
                    phase = probe.current()
                    probe.fail(phase.name if phase else "first result", *cause)
        if probe.status in TERMINAL_STATUSES:
            for name in JOB_PHASES:
                probe.skip(name, "no job seen (the batch ended without one, or between polls)")
            self._notified(probe)

    @staticmethod
    def _job_detail(jobs: list[JobView], phase: str) -> str:
        if phase == "job queued" and jobs:
            return f"{len(jobs)} job(s): {', '.join(sorted({j.job_id for j in jobs}))[:80]}"
        return ""

    def _notified(self, probe: Probe) -> None:
        assert probe.batch_id
        if probe.phase("notification").status != "pending" or not self.state_machine:
            probe.skip("notification", "no StateMachineArn output")
            return
        try:
            execution = self.account.execution(self.state_machine, probe.batch_id)
        except AccountReadError as e:
            probe.skip("notification", f"could not read the execution: {e}")
            return
        if execution is None:
            probe.fail("notification", "the batch has no Step Functions execution")
            return
        exited = [t for t, kind, name in execution.events if kind.endswith("StateExited") and name == "Notify"]
        if exited:
            # Times from the execution's own clock; finalize was seen at a poll, so never earlier than that.
            at = max(exited[0], probe.phase("finalize").at or 0.0)
            probe.reach("notification", at, detail="the Notify step finished (webhooks, SNS, e-mail)")
        elif execution.status in ("FAILED", "TIMED_OUT", "ABORTED"):
            probe.fail("notification", f"the execution ended {execution.status} before Notify",
                       "open the execution in the Step Functions console (its name is the batch id)")

    def _failure(self, job: JobView) -> tuple[str, str] | None:
        """A job failure that a retry will not fix, as (detail, remedy)."""
        reasons = " | ".join([job.status_reason, *job.reasons])
        if "CannotPullContainerError" in reasons:
            return f"job {job.job_id}: {reasons[:300]}", IMAGE_PULL
        if "ResourceInitializationError" in reasons and "secret" in reasons.lower():
            return f"job {job.job_id}: {reasons[:300]}", SECRET_PULL
        if job.log_stream:
            try:
                lines = self.account.log_tail(job.log_group, job.log_stream)
            except AccountReadError:
                return None
            hit = next((line for line in reversed(lines) if HF_ERRORS.search(line)), None)
            if hit:
                return f"job {job.job_id} could not download the model: {hit.strip()[:300]}", GATED_MODEL
        return None

    def diagnose(self, probe: Probe, phase: Phase) -> tuple[str, str] | None:
        try:
            return self._diagnose(probe, phase)
        except AccountReadError as e:
            return f"could not read the account: {e}", "check that your AWS credentials may read the stack"

    def _diagnose(self, probe: Probe, phase: Phase) -> tuple[str, str] | None:
        if probe.batch_id is None:
            return None
        jobs = self.jobs.get(probe.batch_id, [])
        if phase.name == "job STARTING" and any(j.status == "RUNNABLE" for j in jobs):
            if self.blocked:
                return self.blocked[0]
            return ("the job is RUNNABLE: no instance has started for it",
                    "no capacity for these instance types right now, or the account limits them: check the "
                    "compute environment's events and EC2 quotas; with Spot only, allow on-demand "
                    "(cdk.json `capacity`) or add instance types (`gpuInstanceTypes`)")
        if phase.name in ("validate", "job queued") and self.state_machine:
            execution = self.account.execution(self.state_machine, probe.batch_id)
            if execution is None:
                return ("no Step Functions execution for the batch",
                        "the API could not start it: look at the API Lambda's log; the sweeper retries every 5 min")
            states = [name for _, kind, name in execution.events if kind.endswith("StateEntered")]
            where = "Validate has not finished" if phase.name == "validate" else "no AWS Batch job yet"
            return (f"{where}; the execution is {execution.status}, last state "
                    f"{states[-1] if states else 'none'}",
                    "open the execution in the Step Functions console (its name is the batch id)")
        if phase.name in ("model loaded", "first result"):
            failure = next((f for j in jobs if (f := self._failure(j)) is not None), None)
            if failure:
                return failure
            running = [j for j in jobs if j.status == "RUNNING"]
            if running and running[0].log_stream:
                return ("the job is RUNNING and has no result yet (downloading or loading the model?)",
                        f"follow its log: `aws logs tail {running[0].log_group} --log-stream-names "
                        f"{running[0].log_stream} --follow`")
        return None
