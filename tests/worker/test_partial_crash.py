"""Results while running survive a worker crash: every line a partial read showed is in the next read and in
the final file with the same bytes. Real worker subprocesses (deterministic engine) SIGKILLed and restarted
against the loopback moto server; the reads and Finalize are the service's own code."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from nightbatch import layout
from nightbatch.pipeline import BatchTaskInput, finalize_batch
from nightbatch.results.compose import MIN_PART_BYTES
from nightbatch.results.partial import partial_results
from nightbatch.shards.spec import ShardItem, write_manifest
from nightbatch.wiring import build_services
from tests.conftest import RecordingWorkflow

from .conftest import EMBED_MODEL, ShardWorld, chat_requests
from .processes import checkpoints_reach, spawn, wait_until, worker_env

LINES = 400


def read(world: ShardWorld, kind: str = "output", *, inline_limit: int = 0) -> list[bytes]:
    """The partial results route's lines; AWS's inline response limit off (0) unless given."""
    settings = world.adapters.settings.updated({"max_inline_download_bytes": inline_limit})
    services = build_services(dataclasses.replace(world.adapters, settings=settings), RecordingWorkflow())
    found = partial_results(services, "default", world.batch_id, kind)
    return b"".join(found.lines).splitlines(keepends=True)


def test_lines_shown_before_a_kill_keep_their_bytes_after_restart_and_finalize(
        served_world: ShardWorld, tmp_path: Path) -> None:
    world = served_world
    requests = chat_requests(LINES)
    for i in range(0, LINES, 23):
        requests[i]["body"]["messages"][0]["content"] = "FAIL this one"
    world.seed(requests)
    write_manifest(world.adapters.blobs, world.batch_id,
                   [ShardItem(batch_id=world.batch_id, shard_id=world.shard_id)])
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


def embedding_requests(n: int, inputs: int = 200) -> list[dict[str, Any]]:
    """Requests whose result lines are ~25 KB (one small vector per input): a few hundred pass 5 MiB."""
    return [{"custom_id": f"emb-{i:05d}", "body": {"model": EMBED_MODEL, "input": [f"t{i}-{j}" for j in range(inputs)]}}
            for i in range(n)]


class OutputUploads:
    """Bytes this process sends to S3 for one key (PutObject and UploadPart bodies; UploadPartCopy is S3's)."""

    def __init__(self, client: Any, key: str) -> None:
        self.key, self.sent = key, 0
        for op in ("PutObject", "UploadPart"):
            client.meta.events.register(f"before-parameter-build.s3.{op}", self._count)

    def _count(self, params: dict[str, Any], **_: Any) -> None:
        if params.get("Key") == self.key:
            self.sent += len(params.get("Body", b""))


def test_a_kill_between_part_sized_checkpoints_loses_nothing_and_finalize_copies_them(
        served_world: ShardWorld, tmp_path: Path) -> None:
    """The write path that writes output bytes once, at its real sizes (S3's 5 MiB part minimum): a worker
    SIGKILLed between part-sized checkpoints, with a part's worth of lines buffered, loses none (they are run
    again) and duplicates none; the partial results serve exactly what was checkpointed; Finalize copies the
    part-sized checkpoints server-side and uploads only the bytes of the small ones (each attempt's first; its
    last lines are appended to its previous checkpoint)."""
    world = served_world
    n = 720
    ids = world.seed(embedding_requests(n), endpoint="/v1/embeddings", model=EMBED_MODEL)
    write_manifest(world.adapters.blobs, world.batch_id,
                   [ShardItem(batch_id=world.batch_id, shard_id=world.shard_id)])
    env = worker_env(world, NIGHTBATCH_TEST_ENGINE_DELAY="0.02", NIGHTBATCH_CHECKPOINT_BYTES="0",
                     NIGHTBATCH_CHECKPOINT_EVERY_SECONDS="60")  # the first after 8 lines, then by size alone
    blobs = world.adapters.blobs

    first = spawn(env, tmp_path / "first.log")
    assert wait_until(checkpoints_reach(world, 3), first, timeout=60), first.stderr()
    time.sleep(0.3)  # lines of the next part buffered, not yet durable
    assert first.kill()
    keys = world.checkpoint_keys()
    sizes = [blobs.size(k) or 0 for k in keys]
    assert len(keys) == 3 and all(s >= MIN_PART_BYTES for s in sizes[1:]) and sizes[0] < MIN_PART_BYTES
    durable, duplicates = world.results()
    shown = read(world)
    assert duplicates == 0 and len(shown) == len(durable) < n  # what was checkpointed, no more, no less
    assert {json.loads(line)["custom_id"] for line in shown} == set(durable)
    # In AWS a Lambda response holds 4 MiB: the lines that fit, though no part-sized checkpoint fits whole.
    limit = 4 * 1024 * 1024
    fits = read(world, inline_limit=limit)
    assert fits == shown[:len(fits)] and sizes[0] < sum(map(len, fits)) <= limit

    final = spawn({**env, "NIGHTBATCH_TEST_ENGINE_DELAY": "0.002"}, tmp_path / "final.log")
    assert final.wait(timeout=120) == 0, final.stderr()
    results, duplicates = world.results()
    assert duplicates == 0 and sorted(results) == sorted(ids)
    services = build_services(world.adapters, RecordingWorkflow())
    uploads = OutputUploads(blobs.client, layout.output_key(world.batch_id))
    assert finalize_batch(BatchTaskInput(batch_id=world.batch_id), services).status == "completed"
    out = partial_results(services, "default", world.batch_id, "output")
    assert out.complete and out.file is not None
    final_lines = b"".join(services.files.chunks(out.file)).splitlines(keepends=True)
    assert sorted(json.loads(line)["custom_id"] for line in final_lines) == sorted(ids)
    assert set(shown) <= set(final_lines)
    sizes = [blobs.size(k) or 0 for k in world.checkpoint_keys()]
    small = sum(s for s in sizes if s < MIN_PART_BYTES)
    assert uploads.sent == small < MIN_PART_BYTES + 2 * sizes[0]
    written = sum(sizes) + uploads.sent
    output = sum(map(len, final_lines))
    print(f"\n{len(sizes)} checkpoints ({', '.join(f'{s / 2**20:.2f}' for s in sizes)} MiB) from 2 attempts; "
          f"Finalize uploaded {uploads.sent / 2**20:.2f} MiB of {output / 2**20:.2f} MiB, copied the rest; "
          f"checkpoints + Finalize's uploads / output = {written / output:.2f}")
