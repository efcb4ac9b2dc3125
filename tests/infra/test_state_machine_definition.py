"""The workflow's shape as ASL: states, retries, catches and timeouts (executed for real in test_workflow_moto)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nightbatch.settings import JobInputs
from tests.infra.cfn import one_of_type, resolve
from tests.infra.synth import TEST_CONTEXT

CONTEXT_RETRY = TEST_CONTEXT["shardRetry"]


class _Placeholder(dict[str, str]):
    def __missing__(self, key: str) -> str:
        return f"<{key}>"


def render_definition(template: dict[str, Any]) -> dict[str, Any]:
    _, machine = one_of_type(template, "AWS::StepFunctions::StateMachine")
    text = resolve(machine["Properties"]["DefinitionString"], _Placeholder(), lambda lid, attr: f"<{lid}.{attr}>")
    return dict(json.loads(text))


@pytest.fixture(scope="module")
def asl(template: dict[str, Any]) -> dict[str, Any]:
    return render_definition(template)


def test_flow_order(asl: dict[str, Any]) -> None:
    states = asl["States"]
    assert asl["StartAt"] == "Validate"
    assert states["Validate"]["Next"] == "IsValid"
    choice = states["IsValid"]
    assert choice["Choices"] == [{"Variable": "$.validation.valid", "BooleanEquals": True, "Next": "Plan"}]
    assert choice["Default"] == "Notify"  # invalid input: straight to Notify, Validate already failed the batch
    assert states["Plan"]["Next"] == "Shards"
    assert states["Shards"]["Next"] == "Finalize"
    assert states["Finalize"]["Next"] == "Notify"
    assert states["Notify"]["End"] is True


def test_versioned_payloads(asl: dict[str, Any]) -> None:
    for name in ("Validate", "Plan", "Finalize", "Notify"):
        state = asl["States"][name]
        assert state["Resource"] == "arn:aws:states:::lambda:invoke"
        assert state["Parameters"]["Payload"] == {"version": 1, "batch_id.$": "$.batch_id"}
        lambda_retry = state["Retry"][0]
        assert "Lambda.ServiceException" in lambda_retry["ErrorEquals"]


def test_notify_retries_its_own_failures_with_backoff(asl: dict[str, Any]) -> None:
    """M2: an SES throttle or SQS send failure (States.TaskFailed) is retried, not the end of the execution."""
    retry = next(r for r in asl["States"]["Notify"]["Retry"] if r["ErrorEquals"] == ["States.TaskFailed"])
    assert retry["MaxAttempts"] >= 3 and retry["BackoffRate"] > 1 and retry["IntervalSeconds"] >= 10
    assert retry["MaxDelaySeconds"] <= 300


def test_every_step_before_finalize_is_caught_into_it(asl: dict[str, Any]) -> None:
    for name in ("Validate", "Plan", "Shards"):
        (catch,) = asl["States"][name]["Catch"]
        assert catch == {"ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": "Finalize"}


def test_distributed_map_over_json_manifest(asl: dict[str, Any]) -> None:
    shards = asl["States"]["Shards"]
    assert shards["Type"] == "Map"
    assert shards["ItemProcessor"]["ProcessorConfig"] == {"Mode": "DISTRIBUTED", "ExecutionType": "STANDARD"}
    reader = shards["ItemReader"]
    assert reader["Resource"] == "arn:aws:states:::s3:getObject"
    assert reader["ReaderConfig"] == {"InputType": "JSON"}
    assert reader["Parameters"]["Key.$"] == "$.plan.manifest_key"
    # Plan's answer (maxGpus, or a SageMaker model's `sagemakerMaxJobs` if lower), not a constant.
    assert shards["MaxConcurrencyPath"] == "$.plan.max_concurrency" and "MaxConcurrency" not in shards
    assert asl["States"]["Plan"]["ResultSelector"]["max_concurrency.$"] == "$.Payload.max_concurrency"
    assert "ItemBatcher" not in shards


def test_shard_loop_capacity_then_job_sync_with_share_priority_and_catch(asl: dict[str, Any]) -> None:
    processor = asl["States"]["Shards"]["ItemProcessor"]
    states = processor["States"]
    new = states[processor["StartAt"]]
    assert new["Type"] == "Pass" and new["Parameters"]["capacity"] == {} and new["Next"] == "Capacity"
    capacity = states["Capacity"]
    assert "CapacityFunction" in capacity["Resource"] and capacity["ResultPath"] == "$.capacity"
    assert capacity["Parameters"]["shard_error.$"] == "$.shard_error"
    choice = states[capacity["Next"]]
    assert choice["Choices"] == [{"Variable": "$.capacity.action", "StringEquals": "give_up",
                                  "Next": "ShardGivenUp"}]
    wait = states[choice["Default"]]
    assert wait["Type"] == "Wait" and wait["SecondsPath"] == "$.capacity.wait_seconds"
    run = states[wait["Next"]]
    assert run["Resource"] == "arn:aws:states:::batch:submitJob.sync"
    params = run["Parameters"]
    assert params["JobName.$"] == "States.Format('{}-{}', $.batch_id, $.shard_id)"
    assert params["ContainerOverrides"]["Environment"] == [
        {"Name": "NIGHTBATCH_BATCH_ID", "Value.$": "$.batch_id"},
        {"Name": "NIGHTBATCH_SHARD_ID", "Value.$": "$.shard_id"},
        {"Name": "NIGHTBATCH_BACKEND", "Value": "batch"},
    ]
    # The per-job inputs the worker reads (JobInputs), each of them and nothing else; the settings document is
    # for SageMaker jobs (a job definition carries the settings itself).
    assert {e["Name"] for e in params["ContainerOverrides"]["Environment"]} == {
        JobInputs.env_name(f) for f in JobInputs.model_fields if f != "settings_key"}
    # A fair-share queue requires ShareIdentifier; the queue, priority and retry strategy are Capacity's choice.
    assert {params[k] for k in ("JobQueue.$", "ShareIdentifier.$", "SchedulingPriorityOverride.$",
                                "RetryStrategy.$")} == {"$.capacity.queue", "$.capacity.share",
                                                        "$.capacity.priority", "$.capacity.retry_strategy"}
    assert params["JobDefinition.$"] == "$.job_definition" and run["ResultPath"] == "$.job"
    assert set(run["ResultSelector"]) == {"JobId.$", "Status.$"}  # not the job's whole description
    assert run["Retry"][0]["ErrorEquals"] == ["Batch.ServerException", "Batch.AWSBatchException"]
    (catch,) = run["Catch"]
    assert catch == {"ErrorEquals": ["States.ALL"], "ResultPath": "$.shard_error", "Next": "Capacity"}
    assert states["ShardGivenUp"]["Type"] == "Pass"
    assert CONTEXT_RETRY["maxAttempts"] == 2  # Capacity retries other failures (tests/infra/test_capacity_moto)


def test_execution_timeout_is_window_plus_margin(asl: dict[str, Any]) -> None:
    assert asl["TimeoutSeconds"] == (168 + 3) * 3600
