"""The worker started exactly as the synthesized job definition starts it: its command and environment."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.infra.synth import synthesize

from .conftest import ShardWorld, chat_requests
from .processes import job_definition_launch, spawn

pytestmark = [pytest.mark.infra, pytest.mark.slow]


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return synthesize({"nag": False}, tmp_path_factory.mktemp("jobdef") / "cdk.out").template


def test_worker_runs_a_shard_with_the_job_definition_s_command_and_environment(
        template: dict[str, Any], served_world: ShardWorld, tmp_path: Path) -> None:
    world = served_world
    model = "Qwen2.5-7B-Instruct"  # the first served model in cdk.json
    argv, env = job_definition_launch(template, world, model=model, model_cache=tmp_path / "cache")
    assert argv[1:] == ["-m", "gpu_worker"]  # no arguments: ids and settings come from the environment
    assert env["NIGHTBATCH_MODE"] == "aws"
    assert model in [m["name"] for m in json.loads(env["NIGHTBATCH_MODELS_JSON"])]
    ids = world.seed(chat_requests(24), model=model)

    worker = spawn(env, tmp_path / "jobdef.log", argv=argv)
    assert worker.wait(timeout=120) == 0, worker.stderr()
    results, duplicates = world.results()
    assert sorted(results) == sorted(ids) and duplicates == 0
    assert all(line["response"]["body"]["model"] == model for line in results.values())
    assert world.done_marker() is not None
    # In AWS mode the worker logs JSON lines carrying the batch and shard ids (CloudWatch Logs).
    assert any(f'"batch_id": "{world.batch_id}"' in line for line in worker.stderr().splitlines())
