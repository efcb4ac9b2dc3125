"""Results while running survive a worker crash: every line a partial read showed is in the next read and in
the final file with the same bytes. Real worker subprocesses (deterministic engine) SIGKILLed and restarted
against the loopback moto server; the reads and Finalize are the service's own code."""

from __future__ import annotations

import time
from pathlib import Path

from nightbatch import layout
from nightbatch.pipeline import BatchTaskInput, finalize_batch
from nightbatch.results.partial import partial_results
from nightbatch.services import build_services
from tests.conftest import RecordingWorkflow

from .conftest import ShardWorld, chat_requests
from .processes import checkpoints_reach, spawn, wait_until, worker_env

LINES = 400


def read(world: ShardWorld, kind: str = "output") -> list[bytes]:
    services = build_services(world.adapters, RecordingWorkflow())
    found = partial_results(services, "default", world.batch_id, kind)
    return b"".join(found.lines).splitlines(keepends=True)


def test_lines_shown_before_a_kill_keep_their_bytes_after_restart_and_finalize(
        served_world: ShardWorld, tmp_path: Path) -> None:
    world = served_world
    requests = chat_requests(LINES)
    for i in range(0, LINES, 23):
        requests[i]["body"]["messages"][0]["content"] = "FAIL this one"
    world.seed(requests)
    layout.write_manifest(world.adapters.blobs, world.batch_id,
                          [layout.ShardItem(batch_id=world.batch_id, shard_id=world.shard_id)])
    env = worker_env(world, NIGHTBATCH_TEST_ENGINE_DELAY="0.03")

    first = spawn(env, tmp_path / "first.log")
    assert wait_until(checkpoints_reach(world, 3), first, timeout=30), first.stderr()
    time.sleep(0.05)  # maybe inside the next PUT
    assert first.kill()
    read1, errors1 = read(world), read(world, "error")
    assert read1 and errors1

    second = spawn(env, tmp_path / "second.log")
    before = len(world.checkpoint_keys())
    assert wait_until(checkpoints_reach(world, before + 3), second, timeout=30), second.stderr()
    read2 = read(world)  # while the second attempt runs
    assert second.kill()
    assert read2[:len(read1)] == read1 and len(read2) > len(read1)

    final = spawn({**env, "NIGHTBATCH_TEST_ENGINE_DELAY": "0.002"}, tmp_path / "final.log")
    assert final.wait(timeout=60) == 0, final.stderr()
    services = build_services(world.adapters, RecordingWorkflow())
    assert finalize_batch(BatchTaskInput(batch_id=world.batch_id), services).status == "completed"
    out = partial_results(services, "default", world.batch_id, "output")
    err = partial_results(services, "default", world.batch_id, "error")
    assert out.complete and out.file is not None and err.file is not None
    final_out = set(b"".join(services.files.chunks(out.file)).splitlines(keepends=True))
    final_err = set(b"".join(services.files.chunks(err.file)).splitlines(keepends=True))
    assert len(final_out) + len(final_err) == LINES
    assert set(read1) <= final_out and set(read2) <= final_out and set(errors1) <= final_err
    print(f"\npartial reads: {len(read1)} lines after the first kill, {len(read2)} during the second attempt; "
          f"final: {len(final_out)} output + {len(final_err)} error lines, every line shown kept its bytes")
