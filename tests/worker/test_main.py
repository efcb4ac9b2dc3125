"""The container entry in-process: settings from the environment, engine choice, preflight, exit codes."""

from __future__ import annotations

import pytest

from gpu_worker.main import main
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
