"""The workflow's shape as ASL: states, retries, catches and timeouts (executed for real in test_workflow_moto)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from infra.orchestration import VENDED_LOGS_PREFIX
from nightbatch.settings import JobInputs
from tests.infra.cfn import one_of_type, resolve
from tests.infra.synth import TEST_CONTEXT, Synth

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


# Where each Task state's Catch (States.ALL) leads: the path that ends the batch (Finalize, or a Fail state naming
# who takes over) or the shard (Capacity decides again; ShardGivenUp ends the iteration, its lines `shard_failed`).
# A Task state not listed here fails the test: decide where its failures go.
CATCH_INTO = {"Validate": "Finalize", "Plan": "Finalize", "Finalize": "FinalizeFailed", "Notify": "NotifyFailed",
              "Capacity": "ShardGivenUp", "RunShard": "Capacity", "RunShardSageMaker": "Capacity"}
# Task states that do not retry States.TaskFailed in place, and why (every other one does).
NO_TASK_RETRY = {
    "RunShard": "a failed job is Capacity's to judge (Spot to on-demand, to SageMaker, back off or give up); a "
                "retry in place would submit it again to the same queue, defeating the move",
    "RunShardSageMaker": "as RunShard, and a retried training job would reuse its name, which SageMaker refuses "
                         "forever (names are unique per account and region)",
}


def task_states(states: dict[str, Any]) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """Every Task state, the Map's item processor's included: name -> (state, the states of its scope)."""
    found: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    for name, state in states.items():
        if state["Type"] == "Task":
            found[name] = (state, states)
        for inner in (state.get("ItemProcessor"), state.get("Iterator"), *state.get("Branches", [])):
            if inner:
                found.update(task_states(inner["States"]))
    return found


@pytest.mark.parametrize("which", ["synth", "both_synth", "sagemaker_synth"])
def test_every_task_state_retries_its_own_failure_where_safe_and_catches_into_the_end_of_its_path(
        which: str, request: pytest.FixtureRequest) -> None:
    """One error must not stop a batch half-way: each Task state retries States.TaskFailed (any error of its
    own, a timeout) where running it again is safe, and catches everything else into the path that ends the
    shard or the batch cleanly, never into the execution's (or the Map Run's) failure."""
    synth: Synth = request.getfixturevalue(which)
    tasks = task_states(render_definition(synth.template)["States"])
    assert {"Validate", "Plan", "Capacity", "Finalize", "Notify"} <= set(tasks)
    for name, (state, scope) in tasks.items():
        assert name in CATCH_INTO, f"{name}: a Task state with no decided Catch"
        catches = {c["Next"]: c["ErrorEquals"] for c in state.get("Catch", [])}
        assert catches.get(CATCH_INTO[name]) == ["States.ALL"], (name, state.get("Catch"))
        target = scope[CATCH_INTO[name]]
        if target["Type"] == "Fail":
            assert target["Error"] and len(target["Cause"]) > 60, target
        retried = {e for r in state.get("Retry", []) for e in r["ErrorEquals"]}
        if name in NO_TASK_RETRY:
            assert not retried & {"States.TaskFailed", "States.ALL"}, (name, state["Retry"])
        else:
            assert "States.TaskFailed" in retried, (name, state.get("Retry"))
            retry = next(r for r in state["Retry"] if "States.TaskFailed" in r["ErrorEquals"])
            assert retry["MaxAttempts"] >= 2 and retry["IntervalSeconds"] >= 1, (name, retry)


def test_every_exemption_from_retries_has_a_reason() -> None:
    assert all(len(reason) > 60 for reason in NO_TASK_RETRY.values())


def test_the_workflow_logs_to_a_vended_logs_group(template: dict[str, Any]) -> None:
    """CloudWatch Logs' vended delivery needs no resource-policy entry for groups under /aws/vendedlogs/; any
    other group is added to the account's one policy, and past its 5,120 characters the state machine cannot
    be created."""
    _, machine = one_of_type(template, "AWS::StepFunctions::StateMachine")
    [destination] = machine["Properties"]["LoggingConfiguration"]["Destinations"]
    group = destination["CloudWatchLogsLogGroup"]["LogGroupArn"]["Fn::GetAtt"][0]
    name = template["Resources"][group]["Properties"]["LogGroupName"]
    assert name.startswith(VENDED_LOGS_PREFIX) and VENDED_LOGS_PREFIX == "/aws/vendedlogs/states/"
