"""Crash safety: the worker process SIGKILLed at seeded points and restarted until done loses no line and
duplicates none; SIGTERM flushes and exits for a retry. Real subprocesses against a loopback moto server."""

from __future__ import annotations

import random
import time
from pathlib import Path

from nightbatch.ids import batch_request_id
from tests.support.openai_lines import BatchRequestOutput

from .conftest import ShardWorld, chat_requests
from .processes import checkpoints_reach, spawn, wait_until, worker_env

SEED = 20261129
KILL_POINTS = 12
LINES = 600


def assert_complete(world: ShardWorld, custom_ids: list[str]) -> int:
    """Exactly one result per input line after Finalize-style dedupe; returns the duplicates dropped."""
    results, duplicates = world.results()
    assert sorted(results) == sorted(custom_ids), "lines lost"
    for custom_id, line in results.items():
        parsed = BatchRequestOutput.model_validate(line)
        assert parsed.id == batch_request_id(world.batch_id, custom_id)
    return duplicates


def test_sigkill_at_seeded_points_then_restart_loses_and_duplicates_nothing(
    served_world: ShardWorld, tmp_path: Path
) -> None:
    world = served_world
    requests = chat_requests(LINES)
    for i in range(0, LINES, 37):  # engine rejections travel through the same path
        requests[i]["body"]["messages"][0]["content"] = "FAIL this one"
    ids = world.seed(requests)
    env = worker_env(world, NIGHTBATCH_TEST_ENGINE_DELAY="0.04")
    rng = random.Random(SEED)
    kills: list[str] = []
    for point in range(KILL_POINTS):
        worker = spawn(env, tmp_path / f"attempt-{point}.log")
        before = len(world.checkpoint_keys())
        if rng.random() < 0.4:
            # A moment after start: during imports, preflight, reading checkpoints, or early inference.
            at = rng.uniform(0.2, 1.4)
            time.sleep(max(0.0, worker.started + at - time.monotonic()))
            where = f"t+{at:.2f}s"
        else:
            # Right after the k-th new checkpoint object: between PUTs, inside one, or in the counter update.
            k = rng.randint(1, 4)
            wait_until(checkpoints_reach(world, before + k), worker, timeout=20)
            time.sleep(rng.uniform(0.0, 0.08))
            where = f"checkpoint+{k}"
        if worker.kill():
            kills.append(where)
    assert world.done_marker() is None, "the shard finished before the kill points ran out; make it longer"

    before_final = len(world.results()[0])
    # The last attempt runs undisturbed; a faster engine only saves test time.
    final_env = {**env, "NIGHTBATCH_TEST_ENGINE_DELAY": "0.002", "NIGHTBATCH_MAX_IN_FLIGHT": "16"}
    final = spawn(final_env, tmp_path / "final.log")
    assert final.wait(timeout=60) == 0, final.stderr()
    final_seconds = time.monotonic() - final.started

    duplicates = assert_complete(world, ids)
    marker = world.done_marker()
    assert marker is not None and marker["lines"] == LINES and marker["attempts"] >= 2
    results, _ = world.results()
    assert sum(1 for r in results.values() if r["response"]["status_code"] == 400) == len(range(0, LINES, 37))
    print(f"\ncrash safety: {len(kills)} SIGKILLs at {kills}; {len(world.checkpoint_keys())} checkpoint "
          f"objects from {marker['attempts']} attempts; duplicates across checkpoints: {duplicates}; "
          f"{before_final} lines done before the final run, which took {final_seconds:.1f} s")
    assert len(kills) >= 10
    assert duplicates == 0


def test_sigterm_flushes_and_exits_for_a_retry_that_resumes(served_world: ShardWorld, tmp_path: Path) -> None:
    world = served_world
    ids = world.seed(chat_requests(300))
    env = worker_env(world, NIGHTBATCH_TEST_ENGINE_DELAY="0.04",
                     NIGHTBATCH_CHECKPOINT_EVERY_LINES="1000", NIGHTBATCH_CHECKPOINT_EVERY_SECONDS="60",
                     NIGHTBATCH_CHECKPOINT_BYTES=str(1 << 30))
    worker = spawn(env, tmp_path / "term.log")
    # Wait until requests are running (the counters move only at checkpoints, so watch the log).
    assert wait_until(lambda: "attempt" in worker.stderr(), worker, timeout=20), worker.stderr()
    time.sleep(0.5)
    worker.terminate()
    assert worker.wait(timeout=15) == 143, worker.stderr()
    # Nothing reached the cadence, so whatever is durable was flushed by the SIGTERM path.
    flushed, _ = world.results()
    assert 0 < len(flushed) < len(ids)
    assert world.done_marker() is None

    fast = worker_env(world, NIGHTBATCH_TEST_ENGINE_DELAY="0.005")
    retry = spawn(fast, tmp_path / "retry.log")
    assert retry.wait(timeout=30) == 0, retry.stderr()
    assert assert_complete(world, ids) == 0
    marker = world.done_marker()
    assert marker is not None and marker["attempts"] == 2


def test_sigterm_of_a_cancelled_batch_is_a_clean_exit(served_world: ShardWorld, tmp_path: Path) -> None:
    world = served_world
    world.seed(chat_requests(300))
    env = worker_env(world, NIGHTBATCH_TEST_ENGINE_DELAY="0.04",
                     NIGHTBATCH_WORKER_POLL_SECONDS="30")
    worker = spawn(env, tmp_path / "term.log")
    assert wait_until(lambda: "attempt" in worker.stderr(), worker, timeout=20), worker.stderr()
    world.set_status("cancelling")
    worker.terminate()
    assert worker.wait(timeout=15) == 0, worker.stderr()
    assert world.done_marker() is None


def test_an_unstarted_job_of_a_cancelled_batch_ends_at_once(served_world: ShardWorld, tmp_path: Path) -> None:
    world = served_world
    world.seed(chat_requests(5))
    world.set_status("cancelling")
    worker = spawn(worker_env(world), tmp_path / "cancelled.log")
    assert worker.wait(timeout=20) == 0, worker.stderr()
    assert "engine not started" in worker.stderr()
    assert world.checkpoint_keys() == []
