"""The container entry in-process: settings from the environment, engine choice, preflight, exit codes."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from gpu_worker.main import main, serve_shard
from gpu_worker.runner import ShardJob
from nightbatch import layout
from nightbatch.aws import make_adapters
from nightbatch.batches.accounting import attempt_keys
from nightbatch.settings import get_settings
from tests.support.deterministic_engine import DeterministicEngine

from .conftest import ShardWorld, chat_requests
from .processes import DETERMINISTIC


def test_runs_the_shard_named_in_the_environment(env: ShardWorld, capsys: pytest.CaptureFixture[str]) -> None:
    ids = env.seed(chat_requests(12))
    starts = DeterministicEngine.starts
    assert main(["--engine", DETERMINISTIC]) == 0
    assert DeterministicEngine.starts == starts + 1
    results, _ = env.results()
    assert sorted(results) == ids
    assert env.done_marker() is not None
    assert '"finished":true' in capsys.readouterr().out


def test_engine_from_the_setting(env: ShardWorld, monkeypatch: pytest.MonkeyPatch) -> None:
    env.seed(chat_requests(3))
    monkeypatch.setenv("NIGHTBATCH_WORKER_ENGINE", DETERMINISTIC)
    get_settings.cache_clear()
    assert main([]) == 0
    assert env.done_marker() is not None


@pytest.mark.parametrize("status", ["cancelling", "expired", "cancelled"])
def test_a_stopped_batch_ends_the_job_without_starting_the_engine(env: ShardWorld, status: str) -> None:
    env.seed(chat_requests(3))
    env.set_status(status)
    starts = DeterministicEngine.starts
    assert main(["--engine", DETERMINISTIC]) == 0
    assert DeterministicEngine.starts == starts
    assert env.checkpoint_keys() == []


def test_a_finished_shard_ends_the_job_without_starting_the_engine(env: ShardWorld) -> None:
    env.seed(chat_requests(3))
    assert main(["--engine", DETERMINISTIC]) == 0
    starts = DeterministicEngine.starts
    assert main(["--engine", DETERMINISTIC]) == 0
    assert DeterministicEngine.starts == starts


def test_an_attempt_runs_preflight_and_reads_its_shard_once(world: ShardWorld) -> None:
    world.seed(chat_requests(3))
    adapters = make_adapters(world.settings)  # clients of its own: the hooks see this attempt alone
    calls: list[str] = []

    def record(params: dict[str, Any], model: Any, **_: Any) -> None:
        calls.append(f"{model.name} {params.get('Key') or params.get('Prefix')}")

    adapters.blobs.client.meta.events.register("provide-client-params.s3.*", record)
    job = ShardJob(batch_id=world.batch_id, shard_id=world.shard_id)
    assert asyncio.run(serve_shard(job, world.settings, adapters, engine_path=DETERMINISTIC)) == 0
    assert world.done_marker() is not None
    # The done marker listed once (preflight's), the shard's definition read once (its load).
    assert calls.count(f"ListObjectsV2 {layout.done_key(world.batch_id, world.shard_id)}") == 1
    assert calls.count(f"GetObject {layout.shard_key(world.batch_id, world.shard_id)}") == 1


def test_errors_exit_non_zero_so_aws_batch_retries(env: ShardWorld) -> None:
    assert main(["--engine", DETERMINISTIC]) == 1  # no shard definition in S3
    env.seed(chat_requests(3), model="not-in-the-registry")
    assert main(["--engine", DETERMINISTIC]) == 1
    assert main(["--engine", "no_colon_here"]) == 1


def test_a_shard_must_be_named(env: ShardWorld, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NIGHTBATCH_SHARD_ID")
    get_settings.cache_clear()
    with pytest.raises(SystemExit) as exc:
        main(["--engine", DETERMINISTIC])
    assert exc.value.code == 2


def test_sagemaker_job_reads_the_deployment_s_settings_from_the_document_plan_wrote(
        env: ShardWorld, monkeypatch: pytest.MonkeyPatch) -> None:
    """A training job's Environment cannot hold the settings (512 characters a value): it names the document."""
    env.seed(chat_requests(3))
    doc = {"NIGHTBATCH_TABLE": env.settings.deployment.table, "NIGHTBATCH_WORKER_ENGINE": DETERMINISTIC,
           "NIGHTBATCH_WORKER_POLL_SECONDS": "0.1"}
    env.adapters.blobs.put_bytes(layout.worker_settings_key(env.batch_id), json.dumps(doc).encode())
    for name in doc:  # absent from the job's environment; monkeypatch restores that absence afterwards
        monkeypatch.setenv(name, "unset")
        monkeypatch.delenv(name)
    monkeypatch.setenv("NIGHTBATCH_SETTINGS_KEY", layout.worker_settings_key(env.batch_id))
    monkeypatch.setenv("NIGHTBATCH_BACKEND", "sagemaker")
    get_settings.cache_clear()
    assert main([]) == 0  # the engine and the table came from the document
    assert env.done_marker() is not None
    [record] = [json.loads(env.adapters.blobs.get_bytes(k) or b"{}") for k in attempt_keys(env.adapters.blobs,
                                                                                          env.prefix)]
    assert record["phases"]["backend"] == "sagemaker"


def test_sagemaker_s_train_argument_is_accepted(env: ShardWorld) -> None:
    env.seed(chat_requests(2))
    assert main(["--engine", DETERMINISTIC, "train"]) == 0


def test_a_failure_is_written_where_sagemaker_reports_it(
        env: ShardWorld, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    failure = tmp_path / "output" / "failure"
    monkeypatch.setenv("NIGHTBATCH_WORKER_FAILURE_FILE", str(failure))
    get_settings.cache_clear()
    env.seed(chat_requests(2), model="not-in-the-registry")
    assert main(["--engine", DETERMINISTIC]) == 1
    [line] = failure.read_text().splitlines()
    assert line.startswith("LookupError: model 'not-in-the-registry'")


def test_a_missing_settings_document_fails_the_job_and_names_it(
        env: ShardWorld, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    failure = tmp_path / "failure"
    monkeypatch.setenv("NIGHTBATCH_WORKER_FAILURE_FILE", str(failure))
    monkeypatch.setenv("NIGHTBATCH_SETTINGS_KEY", layout.worker_settings_key(env.batch_id))
    env.seed(chat_requests(2))
    assert main(["--engine", DETERMINISTIC]) == 1
    assert layout.worker_settings_key(env.batch_id) in failure.read_text()
    assert env.done_marker() is None


def test_a_sagemaker_job_reads_its_hugging_face_token_from_the_secret(
        env: ShardWorld, monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"hf-token-{env.batch_id}"
    env.adapters.client("secretsmanager").create_secret(Name=name, SecretString="hf_from_the_secret")
    monkeypatch.setenv("HF_TOKEN", "unset")
    monkeypatch.delenv("HF_TOKEN")  # SageMaker cannot inject it; monkeypatch restores its absence afterwards
    monkeypatch.setenv("NIGHTBATCH_WORKER_HF_TOKEN_SECRET", name)
    get_settings.cache_clear()
    env.seed(chat_requests(2))
    assert main(["--engine", DETERMINISTIC]) == 0
    assert os.environ["HF_TOKEN"] == "hf_from_the_secret"
