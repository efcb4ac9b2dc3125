"""SageMaker attempts are priced at ml.* rates: the worker records where it ran (gpu_worker/host.py) in its
accounting record, and the cost reads the training job's billable time (moto's SageMaker) for the Spot saving."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest

from gpu_worker import host
from gpu_worker.main import main
from nightbatch.batches.cost import ML_PRICES, ShardTime, collect_shard_times, cost_summary, training_job_billing
from nightbatch.layout import all_results_prefix
from nightbatch.settings import Settings

from .conftest import ShardWorld, chat_requests
from .processes import DETERMINISTIC

JOB = "batch-0123456789abcdef-shard-00000-1"


def _settings(**names: object) -> Settings:
    return Settings.from_names({"bucket": "b", "table": "t", "region": "us-east-1", **names})


def _training_job(name: str, *, training: int, billable: int) -> None:
    """A finished managed-Spot job as DescribeTrainingJob reports it (moto leaves the two times unset)."""
    from moto.sagemaker.models import sagemaker_backends

    role = boto3.client("iam", region_name="us-east-1").create_role(
        RoleName=f"sm-{name[-8:]}", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    boto3.client("sagemaker", region_name="us-east-1").create_training_job(
        TrainingJobName=name, RoleArn=role, EnableManagedSpotTraining=True,
        AlgorithmSpecification={"TrainingImage": "worker:latest", "TrainingInputMode": "File"},
        OutputDataConfig={"S3OutputPath": "s3://b/out"},
        ResourceConfig={"InstanceType": "ml.g6e.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 100},
        StoppingCondition={"MaxRuntimeInSeconds": 3600, "MaxWaitTimeInSeconds": 7200})
    job = sagemaker_backends["123456789012"]["us-east-1"].training_jobs[name]
    job.training_time_in_seconds, job.billable_time_in_seconds = training, billable


def test_a_sagemaker_attempt_is_recorded_and_priced_from_its_billable_time(
        env: ShardWorld, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINING_JOB_NAME", JOB)
    monkeypatch.setenv("TRAINING_JOB_ARN", f"arn:aws:sagemaker:us-east-1:123456789012:training-job/{JOB}")
    monkeypatch.setenv("SM_TRAINING_ENV", json.dumps({"current_instance_type": "ml.g6e.xlarge"}))
    env.seed(chat_requests(4))
    assert main(["--engine", DETERMINISTIC]) == 0
    times = collect_shard_times(env.adapters.blobs, [all_results_prefix(env.batch_id)])
    assert times.sagemaker and times.training_jobs == [JOB]
    ((instance_type, job, seconds),) = times.sagemaker
    assert (instance_type, job) == ("ml.g6e.xlarge", JOB) and seconds == pytest.approx(times.total)

    _training_job(JOB, training=1000, billable=300)  # managed Spot billed 30 % of the time
    billing = training_job_billing(env.adapters, times)
    assert billing == {JOB: (1000.0, 300.0)}
    cost = cost_summary(_settings(), times, total_tokens=100, output_tokens=50, billing=billing)
    sm = cost["sagemaker"]
    assert sm["spot_savings"] == 0.7 and sm["spot_savings_measured_jobs"] == 1
    expected = times.total * 0.3 * ML_PRICES["ml.g6e.xlarge"] / 3600
    assert sm["estimated_cost_usd"] == pytest.approx(expected, abs=1e-6)
    assert cost["estimated_cost_usd"] == pytest.approx(expected, abs=1e-6)  # nothing ran on Batch


def test_a_batch_attempt_keeps_the_ec2_price(env: ShardWorld, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in host.SAGEMAKER_MARKERS:
        monkeypatch.delenv(name, raising=False)
    env.seed(chat_requests(4))
    assert main(["--engine", DETERMINISTIC]) == 0
    times = collect_shard_times(env.adapters.blobs, [all_results_prefix(env.batch_id)])
    assert times.total > 0 and times.sagemaker == []
    assert training_job_billing(env.adapters, times) == {}  # no SageMaker call at all
    settings = _settings(instance_type="g6e.xlarge", capacity="spot")
    cost = cost_summary(settings, times, total_tokens=100, output_tokens=50)
    assert "sagemaker" not in cost
    assert cost["estimated_cost_usd"] == pytest.approx(times.total * 0.79 / 3600, abs=1e-6)


def test_mixed_attempts_the_setting_saving_and_an_unpriced_type() -> None:
    times = ShardTime(model_load_seconds=100.0, inference_seconds=3500.0, sagemaker=[
        ("ml.g5.xlarge", "job-a", 1800.0), ("", "job-b", 900.0)])  # job-b: a host that did not say its type
    settings = _settings(instance_type="g6.xlarge", capacity="on-demand", sagemaker_spot_savings=0.5)
    cost = cost_summary(settings, times, total_tokens=0, output_tokens=0)
    sm = cost["sagemaker"]
    # job-b falls back to "ml." + the configured type, which has no built-in price: reported, costed 0.
    assert sm["instance_types"] == ["ml.g5.xlarge", "ml.g6.xlarge"]
    assert sm["unpriced_instance_types"] == ["ml.g6.xlarge"]
    assert sm["estimated_cost_usd"] == pytest.approx(1800 * 0.5 * 1.408 / 3600, abs=1e-6)
    batch_part = (3600 - 2700) * 0.8048 / 3600
    assert cost["estimated_cost_usd"] == pytest.approx(batch_part + sm["estimated_cost_usd"], abs=1e-6)
    priced = _settings(instance_type="g6.xlarge", sagemaker_prices_json='{"ml.g6.xlarge": 1.2}')
    assert cost_summary(priced, times, 0, 0)["sagemaker"]["unpriced_instance_types"] == []


def test_every_built_in_ml_price_is_a_type_nightbatch_knows() -> None:
    from infra.gpu_catalog import GPU_SHAPES

    assert {t.removeprefix("ml.") for t in ML_PRICES} <= set(GPU_SHAPES)


def test_host_detection(tmp_path: Path) -> None:
    assert host.detect({}) == host.Host()
    config = tmp_path / "resourceconfig.json"
    config.write_text(json.dumps({"current_host": "algo-1", "current_instance_type": "ml.p5.48xlarge"}))
    arn = "arn:aws:sagemaker:us-east-1:123456789012:training-job/batch-1-shard-2-1"
    found = host.detect({"TRAINING_JOB_ARN": arn}, resource_config=config)
    assert found == host.Host(backend="sagemaker", instance_type="ml.p5.48xlarge", training_job="batch-1-shard-2-1")
    # The state machine's word wins over the markers.
    assert host.detect({"NIGHTBATCH_BACKEND": "batch", "TRAINING_JOB_ARN": arn}, resource_config=config).backend \
        == "batch"
    declared = host.detect({"NIGHTBATCH_BACKEND": "sagemaker"}, resource_config=tmp_path / "absent.json")
    assert declared == host.Host(backend="sagemaker")
