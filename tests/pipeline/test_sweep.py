"""The sweeper re-drives never-started batches, finalizes abandoned ones, and emits EMF gauges in AWS mode."""

from __future__ import annotations

import json

import pytest

from nightbatch.metrics import emf_line
from nightbatch.pipeline import BatchTaskInput, validate_batch
from nightbatch.pipeline.sweep import sweep
from nightbatch.wiring import Services
from tests.support.pipeline_world import chat_line, jsonl, make_batch


def test_stale_validating_batch_is_redriven(services: Services) -> None:
    batch_id = make_batch(services, jsonl([chat_line(1)]))
    workflow = services.batches.workflow
    assert sweep(services, stale_seconds=3600)["redriven"] == []
    assert sweep(services, stale_seconds=-1)["redriven"] == [batch_id]
    assert workflow.started == [batch_id, batch_id]  # type: ignore[attr-defined]


def test_batch_past_its_window_is_finalized_as_expired(services: Services) -> None:
    batch_id = make_batch(services, jsonl([chat_line(1), chat_line(2)]))
    validate_batch(BatchTaskInput(batch_id=batch_id), services)
    services.adapters.table.update(batch_id, set_={"expires_at": 1})
    assert sweep(services)["finalized"] == [batch_id]
    batch = services.batches.get("default", batch_id)
    assert batch.status == "expired" and batch.request_counts.failed == 2


def test_gauges_are_emf_in_aws_mode(services: Services, capsys: pytest.CaptureFixture[str]) -> None:
    make_batch(services, jsonl([chat_line(1)]))
    services.settings.deployment.mode = "aws"
    sweep(services, stale_seconds=3600)
    records = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    open_ = [r for r in records if "BatchesOpen" in r]
    assert open_ and open_[0]["Status"] == "validating" and open_[0]["BatchesOpen"] == 1
    assert open_[0]["_aws"]["CloudWatchMetrics"][0] == {
        "Namespace": "nightbatch", "Dimensions": [["Status"]], "Metrics": [{"Name": "BatchesOpen", "Unit": "Count"}]}
    assert any("OldestBatchAgeSeconds" in r for r in records)


def test_emf_line_shape() -> None:
    rec = json.loads(emf_line({"RequestsCompleted": 3}, timestamp_ms=5))
    assert rec == {"_aws": {"Timestamp": 5, "CloudWatchMetrics": [{"Namespace": "nightbatch", "Dimensions": [[]],
                   "Metrics": [{"Name": "RequestsCompleted", "Unit": "Count"}]}]}, "RequestsCompleted": 3}


def _training_job(*names: str) -> None:
    import boto3

    iam = boto3.client("iam", region_name="us-east-1")
    try:
        role = iam.get_role(RoleName="sm-job")["Role"]["Arn"]
    except iam.exceptions.NoSuchEntityException:
        role = iam.create_role(RoleName="sm-job", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    sagemaker = boto3.client("sagemaker", region_name="us-east-1")
    for name in names:
        sagemaker.create_training_job(
            TrainingJobName=name, RoleArn=role,
            AlgorithmSpecification={"TrainingImage": "123456789012.dkr.ecr.us-east-1.amazonaws.com/w:1",
                                    "TrainingInputMode": "File"},
            OutputDataConfig={"S3OutputPath": "s3://wf-bucket/out/"},
            ResourceConfig={"InstanceType": "ml.g6e.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 50},
            StoppingCondition={"MaxRuntimeInSeconds": 3600})


def _status(name: str) -> str:
    return _statuses([name]).pop()


def _statuses(names: list[str]) -> set[str]:
    import boto3

    sagemaker = boto3.client("sagemaker", region_name="us-east-1")
    return {str(sagemaker.describe_training_job(TrainingJobName=n)["TrainingJobStatus"]) for n in names}


def test_the_training_jobs_of_cancelled_and_ended_batches_are_stopped(
        services: Services, monkeypatch: pytest.MonkeyPatch) -> None:
    from nightbatch.pipeline.training_jobs import deployment_job_prefix, job_name
    from tests.infra.moto_sagemaker import patch_stoppable_training_jobs

    patch_stoppable_training_jobs(monkeypatch)
    prefix = deployment_job_prefix("Nightbatch-prod")
    services.settings.capacity.sagemaker_json = json.dumps({"job_prefix": prefix})
    table = services.adapters.table
    cancelling, running, completed = (make_batch(services, jsonl([chat_line(1)])) for _ in range(3))
    for batch_id in (cancelling, running, completed):
        validate_batch(BatchTaskInput(batch_id=batch_id), services)
    services.batches.cancel("default", cancelling)
    table.update(completed, set_={"status": "completed"})
    jobs = {batch_id: [job_name(prefix, batch_id, shard, 1) for shard in ("00000", "00001")]
            for batch_id in (cancelling, running, completed)}
    # Names a sweep must leave alone: another deployment's, and another workload's `batch-…` names.
    others = [job_name(deployment_job_prefix("Nightbatch-dev"), cancelling, "00000", 1),
              f"batch-{cancelling.removeprefix('batch_')}-00000-1"]
    for name in [*(n for names in jobs.values() for n in names), *others]:
        _training_job(name)
    result = sweep(services, stale_seconds=3600)
    assert sorted(result["stopped_training_jobs"]) == sorted(jobs[cancelling] + jobs[completed])
    assert _statuses(jobs[cancelling] + jobs[completed]) == {"Stopping"}
    assert _statuses(jobs[running] + others) == {"InProgress"}
    assert sweep(services, stale_seconds=3600)["stopped_training_jobs"] == []  # Stopping is not InProgress


def test_one_training_job_that_cannot_be_stopped_does_not_stop_the_sweep(
        services: Services, monkeypatch: pytest.MonkeyPatch) -> None:
    from moto.sagemaker.responses import SageMakerResponse

    from nightbatch.pipeline.training_jobs import job_name
    from nightbatch.settings import DEFAULT_JOB_PREFIX
    from tests.infra.moto_sagemaker import patch_stoppable_training_jobs

    patch_stoppable_training_jobs(monkeypatch)
    services.settings.capacity.sagemaker_json = "{}"  # the default prefix
    batch_id = make_batch(services, jsonl([chat_line(1)]))
    services.batches.cancel("default", batch_id)
    first, second = (job_name(DEFAULT_JOB_PREFIX, batch_id, s, 1) for s in ("00000", "00001"))
    for name in (first, second):
        _training_job(name)
    stop = SageMakerResponse.stop_training_job  # type: ignore[attr-defined]

    def refuse_the_first(self: SageMakerResponse) -> object:
        if self._get_param("TrainingJobName") == first:
            raise RuntimeError("throttled")
        return stop(self)

    monkeypatch.setattr(SageMakerResponse, "stop_training_job", refuse_the_first, raising=False)
    assert sweep(services, stale_seconds=3600)["stopped_training_jobs"] == [second]


def test_every_running_training_job_is_looked_at_page_after_page(
        services: Services, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """More running jobs than one listing page, or than the 200 the sweeper once stopped at: the newest, the
    cancelled batch's, are reached through the pages (NextToken) and stopped; out of time, it stops listing."""
    from nightbatch.pipeline.training_jobs import job_name
    from nightbatch.settings import DEFAULT_JOB_PREFIX
    from tests.infra.moto_sagemaker import patch_stoppable_training_jobs

    patch_stoppable_training_jobs(monkeypatch)
    services.settings.capacity.sagemaker_json = "{}"  # the default prefix
    running, cancelled = (make_batch(services, jsonl([chat_line(1)])) for _ in range(2))
    for batch_id in (running, cancelled):
        validate_batch(BatchTaskInput(batch_id=batch_id), services)
    services.batches.cancel("default", cancelled)
    older = [job_name(DEFAULT_JOB_PREFIX, running, f"{i:05d}", 1) for i in range(230)]
    newest = [job_name(DEFAULT_JOB_PREFIX, cancelled, f"{i:05d}", 1) for i in range(3)]
    _training_job(*older, *newest)
    assert sorted(sweep(services, stale_seconds=3600)["stopped_training_jobs"]) == sorted(newest)
    assert _statuses(newest) == {"Stopping"} and _statuses(older) == {"InProgress"}
    later = job_name(DEFAULT_JOB_PREFIX, cancelled, "00003", 2)
    _training_job(later)
    assert sweep(services, stale_seconds=3600, training_jobs_seconds=0)["stopped_training_jobs"] == []
    assert "out of time after 0 training jobs" in caplog.text and _status(later) == "InProgress"
