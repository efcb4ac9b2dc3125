"""Step Functions payload limits with many shards: a batch whose 1,000+ shards all fail still finalizes.

moto's interpreter does not enforce the 256 KiB payload quota, so the test measures what AWS would check: the
Distributed Map's own result (before ResultPath; AWS raises States.DataLimitExceeded on it, uncatchable) and
every input and output in the execution history.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from tests.infra.moto_workflow import (
    REGION,
    Deployment,
    wait_for_execution,
)
from tests.infra.synth import synthesize
from tests.infra.test_workflow_moto import (
    _clear_caches,
    chat_line,
    create_batch,
    deploy_in_moto,
    execution_arn,
    jsonl,
    read_file,
)

SHARDS = 1000
PAYLOAD_LIMIT = 256 * 1024
# No state machine retries (each would sleep in moto), and enough Map concurrency to get through in seconds.
CONTEXT = {"shardRetry": {"maxAttempts": 0, "intervalSeconds": 1, "backoffRate": 1.0}, "maxGpus": 20, "nag": False}


@pytest.fixture(scope="module")
def many_shards_template(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return synthesize(CONTEXT, tmp_path_factory.mktemp("many-shards") / "cdk.out").template


@pytest.fixture
def map_results(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Sizes (bytes of JSON) of each Map state's result, as the interpreter produced it."""
    from moto.stepfunctions.parser.asl.component.state.exec.state_map.state_map import StateMap

    sizes: list[int] = []
    original = StateMap._eval_execution

    def measured(self: Any, env: Any) -> None:
        original(self, env)
        sizes.append(len(json.dumps(env.stack[-1]).encode()))

    monkeypatch.setattr(StateMap, "_eval_execution", measured)
    return sizes


@pytest.fixture
def deployment(many_shards_template: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Iterator[Deployment]:
    yield from deploy_in_moto(many_shards_template, monkeypatch, backend_lookup=True)


def _history_payload_sizes(arn: str) -> list[int]:
    client = boto3.client("stepfunctions", region_name=REGION)
    sizes = []
    for page in client.get_paginator("get_execution_history").paginate(executionArn=arn):
        for event in page["events"]:
            for key, details in event.items():
                if key.endswith("EventDetails") and isinstance(details, dict):
                    sizes += [len(str(details[k]).encode()) for k in ("input", "output", "cause") if k in details]
    return sizes


@pytest.mark.slow
def test_a_thousand_failed_shards_stay_under_the_payload_limit_and_finalize(
        deployment: Deployment, monkeypatch: pytest.MonkeyPatch, map_results: list[int]) -> None:
    # One line per segment, one segment per shard, and a plan cap above the line count.
    monkeypatch.setenv("NIGHTBATCH_SEGMENT_MAX_LINES", "1")
    monkeypatch.setenv("NIGHTBATCH_SHARD_TARGET_TOKENS", "1")
    monkeypatch.setenv("NIGHTBATCH_SHARDS_PER_GPU", str(SHARDS))
    # Capacity gives a failed shard up at once (its retries would wait, really, in moto's interpreter).
    monkeypatch.setenv("NIGHTBATCH_SHARD_RETRY_ATTEMPTS", "0")
    _clear_caches()
    deployment.failing_shards.add("*")
    services, batch_id = create_batch(jsonl([chat_line(i) for i in range(SHARDS)]))
    # Before the Map starts (Validate and Plan take seconds): the batch is already on on-demand, so Capacity's
    # first decision skips remaining_work_seconds, which reads every unfinished shard's document per call (O(N²)
    # GETs over a batch: 1,000,000 for these 1,000 shards, hours in moto). Reported to fleet (#13); this test
    # is about the payload bounds.
    services.adapters.table.update(batch_id, set_={"capacity_on_demand": "test: skip the slack estimate"})

    execution = wait_for_execution(execution_arn(deployment, batch_id), timeout=600)
    assert execution["status"] == "SUCCEEDED", execution
    assert len(deployment.jobs) == SHARDS and not any(job.succeeded for job in deployment.jobs)

    # Without a ResultWriter this was the 1,000 iterations' outputs, each with a whole Batch job description.
    assert map_results and max(map_results) < 2048, map_results
    sizes = _history_payload_sizes(execution["executionArn"])
    assert sizes and max(sizes) < PAYLOAD_LIMIT // 4

    batch = services.batches.get("default", batch_id)
    assert batch.status == "completed"
    errors = read_file(services, batch.error_file_id)
    assert len(errors) == SHARDS and {line["error"]["code"] for line in errors} == {"shard_failed"}
    assert batch.request_counts.model_dump() == {"total": SHARDS, "completed": 0, "failed": SHARDS}
