"""The GPU backend of each shard: Plan writes it (and the settings document SageMaker jobs read), Capacity keeps a
shard there, moves it between Spot and on-demand, and moves a `both` batch to SageMaker when Batch cannot place it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nightbatch import layout
from nightbatch.aws.records import BatchRecord
from nightbatch.clock import now
from nightbatch.pipeline import BatchTaskInput, plan_batch, validate_batch
from nightbatch.pipeline.capacity import CapacityDecision, decide
from nightbatch.pipeline.training_jobs import JOB_NAME_RE
from nightbatch.settings import DEFAULT_JOB_PREFIX, Settings
from nightbatch.settings import document as settings_document
from nightbatch.shards.spec import ShardItem, read_manifest
from nightbatch.wiring import Services
from tests.pipeline.test_pipeline import run_to_shards
from tests.support.pipeline_world import chat_line, jsonl, make_batch

MODEL = "SmolLM2-135M-Instruct"
SAGEMAKER = {"instance_types": {MODEL: "ml.g6e.xlarge"}, "spot": True, "on_demand": True, "max_pending_seconds": 600}
QUEUES = {"spot": "arn:queue/spot", "on-demand": "arn:queue/od"}


def _planned(services: Services, backend: str) -> tuple[str, list[ShardItem]]:
    services.settings.pipeline.shard_target_tokens = 50
    services.settings.pipeline.backends_json = json.dumps({MODEL: backend})
    services.settings.capacity.sagemaker_json = json.dumps(SAGEMAKER)
    services.settings.capacity.job_queues_json = json.dumps(QUEUES)
    batch_id = make_batch(services, jsonl([chat_line(i) for i in range(1, 13)]))
    run_to_shards(services, batch_id)
    return batch_id, read_manifest(services.adapters.blobs, batch_id)


def _ask(services: Services, item: ShardItem, capacity: dict[str, Any] | None = None,
         error: dict[str, Any] | None = None) -> CapacityDecision:
    return decide({**item.model_dump(), "capacity": capacity or {}, "shard_error": error or {}}, services)


def _batch_failure(reason: str) -> dict[str, Any]:
    return {"Error": "States.TaskFailed", "Cause": json.dumps({"Status": "FAILED", "StatusReason": reason})}


def _training_failure(secondary: str, reason: str) -> dict[str, Any]:
    return {"Error": "States.TaskFailed", "Cause": json.dumps(
        {"TrainingJobStatus": "Failed", "SecondaryStatus": secondary, "FailureReason": reason})}


@pytest.mark.parametrize(("backend", "expected"), [("batch", ("batch", False)), ("sagemaker", ("sagemaker", False)),
                                                   ("both", ("batch", True))])
def test_plan_writes_each_shard_s_backend(services: Services, backend: str, expected: tuple[str, bool]) -> None:
    batch_id, items = _planned(services, backend)
    assert len(items) > 1 and {(i.backend, i.fallback) for i in items} == {expected}
    raw = services.adapters.blobs.get_bytes(layout.worker_settings_key(batch_id))
    if backend == "batch":
        assert raw is None  # a job definition carries the settings itself
        return
    assert raw is not None
    environ: dict[str, str] = {}
    settings_document.apply(raw, environ)
    assert environ["NIGHTBATCH_BUCKET"] == "wf-bucket" and environ["NIGHTBATCH_SHARD_TARGET_TOKENS"] == "50"
    # The document gives a worker the settings Plan ran with.
    assert Settings(**settings_document_sections(environ)).pipeline.shard_target_tokens == 50


def settings_document_sections(environ: dict[str, str]) -> dict[str, dict[str, str]]:
    from nightbatch.settings import SETTINGS, nest

    return nest({s.name: environ[s.env] for s in SETTINGS.values() if s.env in environ})


def test_a_sagemaker_shard_gets_a_training_job_on_spot_bounded_by_the_slack(services: Services) -> None:
    batch_id, items = _planned(services, "sagemaker")
    decision = _ask(services, items[0])
    assert decision.backend == "sagemaker" and decision.capacity == "spot" and decision.managed_spot
    assert JOB_NAME_RE.match(decision.job_name) and "_" not in decision.job_name
    assert decision.job_name.startswith(DEFAULT_JOB_PREFIX + batch_id.removeprefix("batch_") + "-00000-1-")
    assert decision.instance_type == "ml.g6e.xlarge"
    stop = decision.stopping_condition
    assert stop["MaxWaitTimeInSeconds"] >= stop["MaxRuntimeInSeconds"] and stop["MaxWaitTimeInSeconds"] < 24 * 3600
    assert decision.settings_key == layout.worker_settings_key(batch_id)
    assert decision.output_uri == f"s3://wf-bucket/{layout.training_output_prefix(batch_id)}"
    assert decision.job_name != _ask(services, items[0]).job_name  # names are never reused


def test_a_spot_training_job_that_waited_too_long_reruns_on_demand(services: Services) -> None:
    _, items = _planned(services, "sagemaker")
    first = _ask(services, items[0])
    second = _ask(services, items[0], first.model_dump(), _training_failure("MaxWaitTimeExceeded", "spot"))
    assert (second.backend, second.capacity, second.managed_spot) == ("sagemaker", "on-demand", False)
    assert set(second.stopping_condition) == {"MaxRuntimeInSeconds", "MaxPendingTimeInSeconds"}
    assert second.stopping_condition["MaxPendingTimeInSeconds"] == 1800  # SageMaker's minimum
    assert second.reason.startswith("spot attempt ended: MaxWaitTimeExceeded")


QUOTA = {"Error": "SageMaker.ResourceLimitExceededException",
         "Cause": "The account-level service limit 'ml.g6e.xlarge for spot training job usage' is 1 Instances"}


@pytest.mark.parametrize("error", [QUOTA, {"Error": "SageMaker.AmazonSageMakerException",
                                           "Cause": "ResourceLimitExceeded: The account-level service limit ..."}])
@pytest.mark.parametrize("capacity", ["spot", "on-demand"])
def test_a_quota_refusal_waits_on_the_same_capacity_without_counting_a_failure(
        services: Services, capacity: str, error: dict[str, Any]) -> None:
    batch_id, items = _planned(services, "sagemaker")
    decision = _ask(services, items[0]).model_copy(update={"capacity": capacity, "managed_spot": capacity == "spot"})
    waits = []
    for _ in range(4):
        decision = _ask(services, items[0], decision.model_dump(), error)
        assert (decision.action, decision.backend, decision.capacity) == ("run", "sagemaker", capacity)
        assert decision.failures == 0 and decision.reason.startswith("waiting for quota: ")
        waits.append(decision.wait_seconds)
    assert waits == [60, 120, 240, 480] and decision.quota_waits == 4 and decision.attempt == 5
    record = services.adapters.table.get_record(BatchRecord, batch_id)
    assert record is not None and record.capacity_on_demand is None  # the batch's other shards stay on Spot


def test_a_quota_refusal_with_no_slack_left_falls_back(services: Services) -> None:
    batch_id, items = _planned(services, "sagemaker")
    services.adapters.table.update_attributes(BatchRecord, batch_id, set_={"expires_at": now() + 600})
    spot = _ask(services, items[0]).model_copy(update={"capacity": "spot"})
    moved = _ask(services, items[0], spot.model_dump(), QUOTA)
    assert moved.capacity == "on-demand" and moved.reason.startswith("spot attempt ended: ResourceLimitExceeded")
    again = _ask(services, items[0], moved.model_dump(), QUOTA)
    assert again.capacity == "on-demand" and again.failures == 1 and again.reason.startswith("retry after:")


def test_both_moves_to_sagemaker_when_batch_on_demand_cannot_place_and_the_rest_follow(
        services: Services) -> None:
    batch_id, items = _planned(services, "both")
    first = _ask(services, items[0])
    assert (first.backend, first.capacity) == ("batch", "spot")
    shortage = _batch_failure("CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY - Service cannot fulfill the capacity")
    second = _ask(services, items[0], first.model_dump(), shortage)
    assert (second.backend, second.capacity) == ("batch", "on-demand")  # Batch's own fallback first
    third = _ask(services, items[0], second.model_dump(), shortage)
    assert (third.backend, third.capacity) == ("sagemaker", "on-demand")
    assert third.reason.startswith("batch could not place it: CAPACITY:")
    record = services.adapters.table.get_record(BatchRecord, batch_id)
    assert record is not None and record.backend_moved == third.reason
    assert _ask(services, items[1]).backend == "sagemaker"


def test_without_fallback_a_batch_shortage_stays_on_batch(services: Services) -> None:
    _, items = _planned(services, "batch")
    first = _ask(services, items[0]).model_copy(update={"capacity": "on-demand"})
    again = _ask(services, items[0], first.model_dump(), _batch_failure("CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY"))
    assert again.backend == "batch" and again.reason.startswith("retry after: CAPACITY:")


def test_a_training_job_runs_on_the_type_of_the_model_its_shard_serves(services: Services) -> None:
    """The batch's `model` is its first line's, which may be a LoRA adapter or, in a multi-model batch, another
    model: the instance type comes from the shard's own model."""
    _, items = _planned(services, "sagemaker")
    services.adapters.table.update_attributes(BatchRecord, items[0].batch_id, set_={"model": "some-adapter"})
    assert _ask(services, items[0]).instance_type == "ml.g6e.xlarge"


@pytest.mark.parametrize(("backend", "max_jobs", "expected"), [
    ("sagemaker", {MODEL: 2}, 2), ("both", {MODEL: 2}, 2), ("sagemaker", {}, 4), ("batch", {MODEL: 2}, 4),
    ("sagemaker", {MODEL: 9}, 4)])
def test_plan_caps_the_map_s_concurrency_at_the_model_s_sagemaker_quota(
        services: Services, backend: str, max_jobs: dict[str, int], expected: int) -> None:
    services.settings.pipeline.max_gpus = 4
    services.settings.pipeline.shard_target_tokens = 20
    services.settings.pipeline.segment_max_lines = 2
    services.settings.pipeline.backends_json = json.dumps({MODEL: backend})
    services.settings.capacity.sagemaker_json = json.dumps({**SAGEMAKER, "max_jobs": max_jobs})
    batch_id = make_batch(services, jsonl([chat_line(i) for i in range(1, 13)]))
    validate_batch(BatchTaskInput(batch_id=batch_id), services)
    planned = plan_batch(BatchTaskInput(batch_id=batch_id), services)
    assert planned.shard_count > 4 and planned.max_concurrency == expected
