"""Endpoint shards in Plan and Capacity: they start on the model's endpoint (the runner's queue and job definition);
when the runner stopped because the window's slack would run out at the endpoint's pace, or failed past its retries,
the shard's remaining lines move to the model's GPU backend, recorded on the batch, and the batch's shards not yet
started follow. The pace rule itself (nightbatch/shards/pace.py) on its numbers."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from nightbatch.aws.records import BatchRecord
from nightbatch.clock import now
from nightbatch.pipeline.capacity import CapacityDecision, decide
from nightbatch.shards.pace import EndpointPace, endpoint_slack, must_move, read_pace, write_pace
from nightbatch.shards.spec import ShardItem, read_manifest
from nightbatch.wiring import Services
from tests.pipeline.test_pipeline import run_to_shards
from tests.support.pipeline_world import chat_line, jsonl, make_batch

MODEL = "llama-8b"
ENDPOINT = {"url": "http://10.0.3.7:8000/v1", "model": "meta-llama/Llama-3.1-8B-Instruct"}
QUEUES = {"spot": "arn:queue/spot", "on-demand": "arn:queue/od"}


def _planned(services: Services, *, source: str = "hf:meta-llama/Llama-3.1-8B-Instruct",
             gpu_backend: str = "batch") -> tuple[str, list[ShardItem]]:
    model: dict[str, Any] = {"name": MODEL, "endpoint": ENDPOINT, **({"source": source} if source else {})}
    services.settings.serving.models_json = json.dumps([model])
    services.settings.pipeline.shard_target_tokens = 50
    services.settings.pipeline.backends_json = json.dumps({MODEL: gpu_backend})
    services.settings.pipeline.job_definitions_json = json.dumps({MODEL: "arn:jobdef/llama-gpu"})
    services.settings.capacity.job_queues_json = json.dumps(QUEUES)
    services.settings.capacity.endpoint_job_queue = "arn:queue/endpoint-runner"
    services.settings.capacity.endpoint_job_definition = "arn:jobdef/endpoint-runner"
    services.settings.capacity.sagemaker_json = json.dumps({"instance_types": {MODEL: "ml.g6e.xlarge"}})
    batch_id = make_batch(services, jsonl([chat_line(i, model=MODEL) for i in range(1, 13)]))
    run_to_shards(services, batch_id)
    return batch_id, read_manifest(services.adapters.blobs, batch_id)


def _ask(services: Services, item: ShardItem, capacity: dict[str, Any] | None = None,
         error: dict[str, Any] | None = None) -> CapacityDecision:
    return decide({**item.model_dump(), "capacity": capacity or {}, "shard_error": error or {}}, services)


RUNNER_EXITED = {"Error": "States.TaskFailed", "Cause": json.dumps(
    {"Status": "FAILED", "StatusReason": "Essential container in task exited"})}


def _slow_pace(batch_id: str, shard_id: str, services: Services) -> EndpointPace:
    pace = EndpointPace(attempt="a1", at=now(), lines=3, done=1, lines_per_second=0.0001, measured_seconds=600,
                        seconds_left=3600)
    reason = must_move(pace, margin_seconds=services.settings.capacity.margin_seconds, measure_seconds=300)
    assert reason is not None
    pace = pace.model_copy(update={"move": True, "reason": reason})
    write_pace(services.adapters.blobs, batch_id, shard_id, pace)
    return pace


@pytest.mark.parametrize(("source", "gpu_backend", "fallback"), [
    ("hf:meta-llama/Llama-3.1-8B-Instruct", "batch", "batch"),
    ("hf:meta-llama/Llama-3.1-8B-Instruct", "sagemaker", "sagemaker"),
    ("", "batch", ""),  # no weights of its own: nowhere to move
])
def test_plan_starts_an_endpoint_model_on_its_endpoint_with_its_gpu_fallback(
        services: Services, source: str, gpu_backend: str, fallback: str) -> None:
    _, items = _planned(services, source=source, gpu_backend=gpu_backend)
    assert len(items) > 1 and {(i.backend, i.gpu_fallback) for i in items} == {("endpoint", fallback)}


def test_an_endpoint_shard_runs_on_the_runner_queue(services: Services) -> None:
    _, items = _planned(services)
    decision = _ask(services, items[0])
    assert (decision.action, decision.backend, decision.queue, decision.job_definition) == (
        "run", "endpoint", "arn:queue/endpoint-runner", "arn:jobdef/endpoint-runner")
    assert decision.retry_strategy == {"Attempts": 1}


def test_a_runner_stopped_for_its_pace_moves_the_shard_to_the_gpu_backend_and_the_batch_follows(
        services: Services) -> None:
    batch_id, items = _planned(services)
    first = _ask(services, items[0])
    pace = _slow_pace(batch_id, items[0].shard_id, services)
    moved = _ask(services, items[0], first.model_dump(), RUNNER_EXITED)
    assert (moved.action, moved.backend, moved.queue) == ("run", "batch", "arn:queue/spot")
    assert moved.reason.startswith("endpoint too slow: endpoint pace") and str(pace.remaining) in moved.reason
    record = services.adapters.table.get_record(BatchRecord, batch_id)
    assert record is not None and record.backend_moved_to == "batch"
    assert record.backend_moved is not None and record.backend_moved.startswith("endpoint too slow")
    # A shard of the batch not started yet goes straight to the GPU backend; the moved one stays there.
    assert _ask(services, items[1]).backend == "batch"
    assert _ask(services, items[0], moved.model_dump()).backend == "batch"


def test_a_sagemaker_model_moves_to_a_training_job(services: Services) -> None:
    batch_id, items = _planned(services, gpu_backend="sagemaker")
    first = _ask(services, items[0])
    _slow_pace(batch_id, items[0].shard_id, services)
    moved = _ask(services, items[0], first.model_dump(), RUNNER_EXITED)
    assert (moved.backend, moved.instance_type) == ("sagemaker", "ml.g6e.xlarge") and moved.job_name


def test_a_failing_runner_is_retried_on_the_endpoint_then_moves(services: Services) -> None:
    _, items = _planned(services)
    decision = _ask(services, items[0])
    for failures in range(1, services.settings.capacity.retry_attempts + 1):
        decision = _ask(services, items[0], decision.model_dump(), RUNNER_EXITED)
        assert (decision.backend, decision.failures, decision.action) == ("endpoint", failures, "run")
        assert decision.wait_seconds > 0 and decision.reason.startswith("retry after:")
    moved = _ask(services, items[0], decision.model_dump(), RUNNER_EXITED)
    assert moved.backend == "batch" and moved.reason.startswith("endpoint runner failed")


def test_without_weights_a_slow_endpoint_shard_stays_and_a_failing_one_is_given_up(services: Services) -> None:
    batch_id, items = _planned(services, source="")
    decision = _ask(services, items[0])
    _slow_pace(batch_id, items[0].shard_id, services)
    for _ in range(services.settings.capacity.retry_attempts):
        decision = _ask(services, items[0], decision.model_dump(), RUNNER_EXITED)
        assert (decision.backend, decision.action) == ("endpoint", "run")
    last = _ask(services, items[0], decision.model_dump(), RUNNER_EXITED)
    assert (last.backend, last.action) == ("endpoint", "give_up")
    record = services.adapters.table.get_record(BatchRecord, batch_id)
    assert record is not None and record.backend_moved is None


def test_the_pace_rule() -> None:
    assert endpoint_slack(1000, 100, 1.0) == 900 and endpoint_slack(1000, 0, 0.0) == 1000
    assert endpoint_slack(1000, 5, 0.0) == -math.inf
    base = EndpointPace(lines=1000, done=400, lines_per_second=1.0, measured_seconds=600, seconds_left=3000)
    assert must_move(base, margin_seconds=1800, measure_seconds=300) is None  # 600 s of work, 2400 s of slack
    late = base.model_copy(update={"seconds_left": 2000})
    reason = must_move(late, margin_seconds=1800, measure_seconds=300)
    assert reason is not None and "600 remaining lines in 600 s, 2000 s left" in reason
    assert must_move(late, margin_seconds=1800, measure_seconds=900) is None  # not measured long enough yet
    stalled = base.model_copy(update={"lines_per_second": 0.0})
    assert "in never" in (must_move(stalled, margin_seconds=0, measure_seconds=0) or "")
    assert must_move(base.model_copy(update={"done": 1000, "seconds_left": 0}), margin_seconds=1800,
                     measure_seconds=0) is None  # nothing left to move


def test_pace_records_round_trip(services: Services) -> None:
    pace = EndpointPace(attempt="x", lines=3, done=2, move=True, reason="r")
    write_pace(services.adapters.blobs, "batch_1", "00000", pace)
    assert read_pace(services.adapters.blobs, "batch_1", "00000") == pace
    assert read_pace(services.adapters.blobs, "batch_1", "00001") is None
