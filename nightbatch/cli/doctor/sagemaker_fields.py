"""Proving, in the user's account, which of the CreateTrainingJob fields Step Functions' documentation does not list
for `createTrainingJob.sync` (nightbatch/pipeline/training_jobs.py UNLISTED_FIELDS) its SageMaker integration
accepts, and saying which to turn on (cdk.json `sagemakerFields`).

Step Functions' TestState runs the deployed RunShardSageMaker state, with the workflow's own role, once without
the fields and once with each: as a request-response task (TestState runs `.sync` only against a mock, which would
prove nothing), on an input whose job name is one character over SageMaker's 63. Step Functions checks the
fields it passes on (a fixed field when it reads the definition: InvalidDefinition; a run-time one when it builds
the request: "not supported by Step Functions"); SageMaker then refuses the name, so no job is ever created. A
SageMaker error therefore means Step Functions accepted every field of that request.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from nightbatch.aws.account import AccountReadError, AwsAccount, StateTest
from nightbatch.cli.doctor.report import Check, Report
from nightbatch.pipeline.training_jobs import (
    MAX_JOB_NAME,
    MIN_PENDING_SECONDS,
    SAGEMAKER_FIELDS_OUTPUT,
    UNLISTED_FIELDS,
    deployment_job_prefix,
    with_fields,
)

STATE = "RunShardSageMaker"
NAME = "SageMaker field"
# What turning each on changes (and what the deployment does without it).
WHAT = {
    "ContainerEntrypoint": "the job names the worker's entry point instead of SageMaker starting the image's "
                           "ENTRYPOINT with `train`",
    "RetryStrategy": "SageMaker retries its own internal errors in the job instead of Capacity counting a failed "
                     "attempt",
    "MaxPendingTimeInSeconds": "an on-demand job waits for an instance up to runnableTimeoutMinutes instead of "
                               "failing at once with CapacityError",
}
Verdict = Literal["accepted", "refused", "unknown"]


def find_state(states: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The state called `name`, in a Map's item processor too."""
    for key, state in states.items():
        if key == name:
            return dict(state)
        for inner in (state.get("ItemProcessor"), state.get("Iterator"), *state.get("Branches", [])):
            found = find_state(inner["States"], name) if inner else None
            if found is not None:
                return found
    return None


def probe_state(state: dict[str, Any], fields: Iterable[str]) -> dict[str, Any]:
    """The deployed task as a request-response call with the fixed ones of `fields` (and no others)."""
    fixed = [f for f in fields if f != "MaxPendingTimeInSeconds"]
    return {"Type": "Task", "Resource": str(state["Resource"]).removesuffix(".sync"),
            "Parameters": with_fields(state["Parameters"], fixed), "End": True}


def probe_input(stack: str, instance_type: str, bucket: str, *, max_pending: bool) -> dict[str, Any]:
    """What Capacity would hand the task, but for a job name SageMaker must refuse (64 characters, in the
    deployment's own prefix, which the workflow's role may create)."""
    name = f"{deployment_job_prefix(stack)}doctor-probe-".ljust(MAX_JOB_NAME + 1, "x")
    assert len(name) == MAX_JOB_NAME + 1
    stopping = {"MaxRuntimeInSeconds": 3600, **({"MaxPendingTimeInSeconds": MIN_PENDING_SECONDS} if max_pending
                                                 else {})}
    return {"batch_id": "batch_" + "0" * 32, "shard_id": "00000",
            "capacity": {"job_name": name, "instance_type": instance_type, "managed_spot": False,
                         "stopping_condition": stopping, "output_uri": f"s3://{bucket}/doctor-probe/",
                         "settings_key": "doctor-probe"}}


def verdict(result: StateTest, field: str | None = None) -> Verdict:
    text = f"{result.error} {result.cause}"
    if "not supported" in text and (field is None or field in text):
        return "refused"
    if result.error.startswith("SageMaker.") or result.status == "SUCCEEDED":
        return "accepted"
    return "unknown"


def _said(result: StateTest) -> str:
    return f"{result.status} {result.error}: {result.cause}"[:300]


def prove(report: Report, account: AwsAccount, outputs: dict[str, str], stack: str) -> None:
    """One check per unlisted field: proven or refused by Step Functions here, sent or not, and what to change."""
    arn, types = outputs.get("StateMachineArn", ""), outputs.get("SageMakerInstanceTypes", "")
    if not arn or not types:
        return
    sent = {f for f in outputs.get(SAGEMAKER_FIELDS_OUTPUT, "none").split(",") if f in UNLISTED_FIELDS}
    try:
        definition, role = account.state_machine(arn)
        state = find_state(definition.get("States", {}), STATE)
        if state is None:
            report.add(Check(NAME, "warn", f"no {STATE} state in {arn}: is the stack deployed with SageMaker?"))
            return
        instance_type = types.split(",")[0]

        def run(fields: tuple[str, ...]) -> StateTest:
            return account.test_state(probe_state(state, fields), role, probe_input(
                stack, instance_type, outputs.get("BucketName", "nightbatch"),
                max_pending="MaxPendingTimeInSeconds" in fields))

        baseline = run(())
        if verdict(baseline) != "accepted":
            report.add(Check(NAME, "warn", f"could not prove the unlisted fields: TestState of {STATE} without them "
                             f"answered {_said(baseline)}", "leave cdk.json `sagemakerFields` as it is until the "
                             "doctor can prove them"))
            return
        results = {field: run((field,)) for field in UNLISTED_FIELDS}
    except AccountReadError as e:
        report.add(Check(NAME, "warn", f"could not prove the unlisted fields: {e}",
                         "the doctor needs states:DescribeStateMachine, states:TestState and iam:PassRole on the "
                         "workflow's role; until then leave cdk.json `sagemakerFields` off"))
        return
    for field, result in results.items():
        report.add(_check(field, verdict(result, field), field in sent, result, account.region))


def _check(field: str, found: Verdict, sent: bool, result: StateTest, region: str) -> Check:
    switch = f'cdk.json "sagemakerFields": {{"{field}": {"false" if found == "refused" else "true"}}}, then cdk deploy'
    if found == "accepted":
        if sent:
            return Check(NAME, "ok", f"{field}: Step Functions accepts it in {region}; sent")
        return Check(NAME, "warn", f"{field}: Step Functions accepts it in {region}; not sent", f"turn it on ("
                     f"{WHAT[field]}): {switch}")
    if found == "refused":
        if sent:
            return Check(NAME, "failed", f"{field}: Step Functions refuses it in {region} ({_said(result)}), and "
                         "the task sends it: every SageMaker shard fails", f"turn it off: {switch}")
        return Check(NAME, "ok", f"{field}: Step Functions refuses it in {region}; not sent (keep it off)")
    return Check(NAME, "warn", f"{field}: not proven: TestState answered {_said(result)}",
                 f"keep it {'on' if sent else 'off'} until the doctor proves it")
