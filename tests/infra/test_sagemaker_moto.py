"""The SageMaker backend in the synthesized workflow on moto: `createTrainingJob.sync` runs the real worker as the
job's container (tests/infra/moto_sagemaker.py), with the real task handlers and the deterministic engine.

- `gpuBackend: sagemaker`: a 3-shard batch completes through training jobs alone; the jobs' Environment holds no
  deployment settings (the worker reads them from the document Plan wrote), names carry no `_`.
- `gpuBackend: both`: AWS Batch cannot place any job (its queues cancel them with CAPACITY:); Capacity moves the
  batch to on-demand, then to SageMaker, and says so in the batch's capacity decisions and phase timings.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from nightbatch import layout
from nightbatch.aws.records import BatchRecord
from nightbatch.pipeline.training_jobs import JOB_NAME_RE, deployment_job_prefix
from nightbatch.settings import JOB_PREFIX_RE
from nightbatch.shards.spec import read_manifest
from nightbatch.wiring import Services
from tests.infra.moto_sagemaker import TrainingJobRecord, TrainingJobs, patch_state_task, patch_training_jobs
from tests.infra.moto_workflow import Deployment, JobRecord, wait_for_execution
from tests.infra.synth import Synth
from tests.infra.test_capacity_moto import SPOT_SHORTAGE, assert_each_line_once, submit
from tests.infra.test_workflow_moto import _clear_caches, deploy_in_moto, execution_arn

ENGINE = "tests.support.deterministic_engine:DeterministicEngine"
LINES = 9  # three segments of three lines, one shard each


@pytest.fixture
def sagemaker_template(sagemaker_synth: Synth) -> dict[str, Any]:
    return sagemaker_synth.template


@pytest.fixture
def both_template(both_synth: Synth) -> dict[str, Any]:
    return both_synth.template


def deploy_with_training_jobs(template: dict[str, Any],
                              monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Deployment, TrainingJobs]]:
    from moto.server import ThreadedMotoServer

    for d in deploy_in_moto(template, monkeypatch):
        patch_state_task(monkeypatch)
        jobs = TrainingJobs(engine=ENGINE)
        patch_training_jobs(monkeypatch, jobs)
        # The job's container is a process of its own: it reaches this process's moto through a server.
        server = ThreadedMotoServer(port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        jobs.endpoint_url = f"http://{host}:{port}"
        monkeypatch.setenv("NIGHTBATCH_SHARD_TARGET_TOKENS", "60")
        monkeypatch.setenv("NIGHTBATCH_SEGMENT_MAX_LINES", "3")
        _clear_caches()
        try:
            yield d, jobs
        finally:
            server.stop()


def _phases(services: Services, batch_id: str) -> dict[str, Any]:
    batch = services.batches.get("default", batch_id)
    phases: dict[str, Any] = (batch.nightbatch or {})["phases"]
    print(f"\nphase timings of {batch_id}:\n{json.dumps(phases, indent=1)}")  # the closing note quotes them
    return phases


def _assert_job_contract(job: TrainingJobRecord, batch_id: str) -> None:
    assert JOB_NAME_RE.match(job.name) and len(job.name) <= 63 and "_" not in job.name, job.name
    # The deployment's own prefix (the stack wrote it into the Capacity and sweeper environments), not `batch-`.
    prefix = json.loads(os.environ["NIGHTBATCH_SAGEMAKER_JSON"])["job_prefix"]
    assert prefix == deployment_job_prefix("nightbatch-prod") and JOB_PREFIX_RE.match(prefix)
    assert job.name.startswith(f"{prefix}{batch_id.removeprefix('batch_')}-{job.shard_id}-")
    assert all(len(v) <= 512 for v in job.env.values()) and len(job.env) <= 100
    # The deployment's settings are not in the job's Environment: the worker read them from the bucket.
    assert "NIGHTBATCH_MODELS_JSON" not in job.env
    assert job.env["NIGHTBATCH_SETTINGS_KEY"] == layout.worker_settings_key(batch_id)
    assert job.env["NIGHTBATCH_BATCH_ID"] == batch_id and job.env["NIGHTBATCH_BACKEND"] == "sagemaker"


def _unlisted(request: dict[str, Any]) -> set[str]:
    """The unlisted CreateTrainingJob fields a request carries (nightbatch/pipeline/training_jobs.py)."""
    found = {k for k in ("RetryStrategy",) if k in request}
    found |= {k for k in ("ContainerEntrypoint",) if k in request.get("AlgorithmSpecification", {})}
    return found | {k for k in ("MaxPendingTimeInSeconds",) if k in request.get("StoppingCondition", {})}


@pytest.mark.parametrize("which", ["sagemaker_synth", "sagemaker_fields_synth"])
def test_a_three_shard_batch_completes_through_sagemaker_training_jobs(
        which: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """By default the task sends only fields Step Functions documents for `createTrainingJob.sync`, and SageMaker
    starts the image's ENTRYPOINT with `train`; with `sagemakerFields` on, ContainerEntrypoint and RetryStrategy
    go with every job."""
    synth: Synth = request.getfixturevalue(which)
    fields_on = which == "sagemaker_fields_synth"
    for d, jobs in deploy_with_training_jobs(synth.template, monkeypatch):
        services, batch_id = submit("default", LINES, "24h")
        execution = wait_for_execution(execution_arn(d, batch_id))
        assert execution["status"] == "SUCCEEDED", execution
        assert d.jobs == []  # nothing went to AWS Batch
        assert len(read_manifest(services.adapters.blobs, batch_id)) == 3
        assert sorted(j.shard_id for j in jobs.jobs) == ["00000", "00001", "00002"]
        for job in jobs.jobs:
            assert job.status == "Completed", job.output
            _assert_job_contract(job, batch_id)
            assert job.instance_type == "ml.g6.xlarge"  # the model's first type (cdk.json)
            assert job.managed_spot and set(job.stopping_condition) == {"MaxRuntimeInSeconds",
                                                                        "MaxWaitTimeInSeconds"}
        sent = jobs.requests[0]
        if fields_on:  # (MaxPendingTimeInSeconds goes with on-demand jobs only: these are Spot)
            assert sent["AlgorithmSpecification"]["ContainerEntrypoint"] == ["python3", "-m", "gpu_worker"]
            assert sent["RetryStrategy"] == {"MaximumRetryAttempts": 2}
            assert all(j.entrypoint == ["python3", "-m", "gpu_worker"] for j in jobs.jobs)
        else:
            assert all(_unlisted(r) == set() for r in jobs.requests), jobs.requests
            assert all(j.entrypoint is None for j in jobs.jobs)  # started as `python3 -m gpu_worker train`
        assert {"Key": "MANAGED_BY_AWS", "Value": "STARTED_BY_STEP_FUNCTIONS"} in sent["Tags"]
        batch = assert_each_line_once(services, "default", batch_id, LINES)
        assert {c["backend"] for c in batch.nightbatch["capacity"]} == {"sagemaker"}
        phases = _phases(services, batch_id)
        assert phases["backends"] == {"sagemaker": 3}


def test_both_moves_shards_batch_cannot_place_to_sagemaker(
        both_template: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    for d, jobs in deploy_with_training_jobs(both_template, monkeypatch):
        # Every Batch job sits RUNNABLE until its queue cancels it: an EC2 GPU quota of 0 looks like this.
        def refuse(job: JobRecord) -> str | None:
            return SPOT_SHORTAGE

        d.refuse = refuse
        services, batch_id = submit("default", LINES, "24h")
        execution = wait_for_execution(execution_arn(d, batch_id))
        assert execution["status"] == "SUCCEEDED", execution
        assert d.jobs and not any(j.succeeded for j in d.jobs)
        assert {j.queue for j in d.jobs} == {"spot", "on-demand"}  # Batch's own fallback first
        assert sorted(j.shard_id for j in jobs.jobs) == ["00000", "00001", "00002"]
        for job in jobs.jobs:
            assert job.status == "Completed", job.output
            _assert_job_contract(job, batch_id)
            # On-demand, without MaxPendingTimeInSeconds until the deployment turns it on (sagemakerFields).
            assert not job.managed_spot and set(job.stopping_condition) == {"MaxRuntimeInSeconds"}
        batch = assert_each_line_once(services, "default", batch_id, LINES)
        decisions = batch.nightbatch["capacity"]
        moved = [c for c in decisions if c["backend"] == "sagemaker"]
        assert {c["shard_id"] for c in moved} == {"00000", "00001", "00002"}
        assert all(c["reason"].startswith("batch could not place it: CAPACITY:") for c in moved), moved
        record = services.adapters.table.get_record(BatchRecord, batch_id)
        assert record is not None and (record.backend_moved or "").startswith("batch could not place it")
        phases = _phases(services, batch_id)
        assert phases["backends"] == {"sagemaker": 3}


class QuotaFull:
    """Refuses the first `times` CreateTrainingJob calls of one shard, as a full account quota does."""

    def __init__(self, shard_id: str, times: int) -> None:
        self.shard_id, self.left = shard_id, times

    def __call__(self, job: TrainingJobRecord) -> str | None:
        if job.shard_id != self.shard_id or self.left <= 0:
            return None
        self.left -= 1
        return "ResourceLimitExceeded"


def test_a_quota_refusal_waits_for_capacity_on_spot_instead_of_failing_the_shard(
        sagemaker_template: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """SageMaker refuses CreateTrainingJob over the account's quota of the type (AWS Batch would queue the job):
    with no retries allowed at all, the refused shard waits and runs on Spot once the quota has room, its batch
    stays on Spot, and no line ends `shard_failed`."""
    for d, jobs in deploy_with_training_jobs(sagemaker_template, monkeypatch):
        monkeypatch.setenv("NIGHTBATCH_SHARD_RETRY_ATTEMPTS", "0")
        monkeypatch.setenv("NIGHTBATCH_SHARD_RETRY_INTERVAL_SECONDS", "1")  # the Wait state really sleeps
        _clear_caches()
        jobs.refuse = QuotaFull("00000", times=2)
        services, batch_id = submit("default", LINES, "24h")
        execution = wait_for_execution(execution_arn(d, batch_id))
        assert execution["status"] == "SUCCEEDED", execution
        first = [j for j in jobs.jobs if j.shard_id == "00000"]
        assert [j.status for j in first] == ["Refused", "Refused", "Completed"], [j.output for j in first]
        assert all(j.managed_spot for j in jobs.jobs)  # Spot stays Spot, for this shard and the others
        assert len({j.name for j in first}) == 3
        batch = assert_each_line_once(services, "default", batch_id, LINES)
        assert batch.request_counts.failed == 0
        waited = [c for c in batch.nightbatch["capacity"] if c["shard_id"] == "00000"]
        assert [c["reason"].split(":")[0] for c in waited[1:]] == ["waiting for quota"] * 2, waited
        record = services.adapters.table.get_record(BatchRecord, batch_id)
        assert record is not None and record.capacity_on_demand is None


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    _clear_caches()
    yield
    _clear_caches()

