"""`nightbatch.output_order: "input"` (nightbatch/results/input_order.py): the output file holds the same lines
as in completion order, in input order, whatever order the lines finished in — within a shard, across its
checkpoints and attempts (a zombie's duplicates lose as always), across shards — with checkpoints of the
0.1.x (no line numbers) or whose summary is gone mixed in; the error file and the counts do not
change; big runs are still copied server-side, not read."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from gpu_worker.checkpoints import Checkpointer, CheckpointPolicy
from gpu_worker.engines.base import EngineReply
from gpu_worker.results import ResultLine, result_line
from nightbatch import layout
from nightbatch.pipeline import BatchTaskInput, finalize_batch, plan_batch, validate_batch
from nightbatch.results.compose import MIN_PART_BYTES
from nightbatch.results.lines import read_checkpoint_summary
from nightbatch.shards.spec import read_manifest
from nightbatch.wiring import Services
from tests.results.test_finalize_summaries import Reads
from tests.support.pipeline_world import chat_line, jsonl, make_batch, planned_shards, shard_requests_of


def answer(batch_id: str, custom_id: str, n: int, pad: str, *, numbered: bool = True, zombie: bool = False
           ) -> ResultLine:
    if n % 11 == 3 and not pad:  # some lines fail: they go to the error file, in both orders
        reply = EngineReply(500, {"error": {"message": f"no {n}", "type": "x", "param": None, "code": 500}})
    else:
        reply = EngineReply(200, {"object": "chat.completion", "choices": [
            {"message": {"content": ("zombie" if zombie else f"a{n}") + pad}}],
            "usage": {"prompt_tokens": n, "completion_tokens": 2, "total_tokens": n + 2}})
    return result_line(batch_id, custom_id, f"req_{n}", reply, number=n if numbered else -1)


def write(services: Services, batch_id: str, shard_id: str, attempt: str, seq: int,
          checkpoints: list[list[ResultLine]]) -> list[str]:
    writer = Checkpointer(blobs=services.adapters.blobs, table=services.adapters.table, batch_id=batch_id,
                          prefix=layout.results_prefix(batch_id, shard_id), attempt=attempt, next_seq=seq,
                          policy=CheckpointPolicy())
    keys = []
    for lines in checkpoints:
        keys.append(layout.checkpoint_key(writer.prefix, writer.seq, attempt))
        writer.write(lines)
    return keys


def finalize(services: Services, batch_id: str, order: str) -> tuple[list[bytes], bytes, dict[str, Any]]:
    services.adapters.table.update(batch_id, set_={"status": "finalizing", "finalize_target": "completed",
                                                   "ext": {"output_order": order}})
    assert finalize_batch(BatchTaskInput(batch_id=batch_id), services).status == "completed"
    batch = services.batches.get("default", batch_id)
    blobs = services.adapters.blobs
    out = blobs.get_bytes(layout.output_key(batch_id)) or b""
    return out.splitlines(keepends=True), blobs.get_bytes(layout.error_key(batch_id)) or b"", \
        batch.request_counts.model_dump()


@pytest.mark.parametrize("seed", [1, 2])
def test_input_order_is_the_completion_order_output_sorted_by_input_line(services: Services, seed: int) -> None:
    rng = random.Random(seed)
    batch_id, shards = planned_shards(services, 700, segment_max_lines=100, shard_target_tokens=3_000)
    assert len(shards) >= 3
    numbers: dict[str, int] = {}
    big: list[str] = []
    for s, (shard_id, _) in enumerate(shards):
        reqs = [(r.number, r.custom_id) for r in shard_requests_of(services, batch_id, shard_id)]
        numbers.update({c: n for n, c in reqs})
        pad = "p" * 130_000 if s == 0 and seed == 1 else ""  # shard 0: checkpoints past S3's part floor, copied
        # Finished about in order, some much later (a long answer): checkpoints overlap in line numbers.
        done = sorted(reqs, key=lambda r: r[0] + rng.choice([0, 0, 0, 0, 3, 30, 300]) * (s != 0))
        cuts = sorted(rng.sample(range(1, len(done)), 5)) if s else [len(done) // 2]
        chunks = [done[a:b] for a, b in zip([0, *cuts], [*cuts, len(done)], strict=True)]
        lines = [[answer(batch_id, c, n, pad) for n, c in chunk] for chunk in chunks]
        if s == 1:  # a zombie attempt wrote some of the same lines after attempt "a"'s first checkpoint: they lose
            zombie = [answer(batch_id, c, n, "", zombie=True) for n, c in chunks[0][::3]]
            write(services, batch_id, shard_id, "z", 1, [zombie])
            lines[1] = [answer(batch_id, c, n, "", numbered=False) for n, c in chunks[1]]  # 0.1.x's
        keys = write(services, batch_id, shard_id, "a", 0, lines[:1]) + write(services, batch_id, shard_id, "b", 1,
                                                                               lines[1:])
        if s == 2:
            services.adapters.blobs.delete(layout.checkpoint_summary_key(keys[2]))  # its summary never written
        if s == 0:
            big += keys
        services.adapters.blobs.put_bytes(layout.done_key(batch_id, shard_id), b"{}")

    by_completion = finalize(services, batch_id, "completion")
    with Reads(services.adapters.blobs) as reads:
        by_input = finalize(services, batch_id, "input")
    out, err, counts = by_input
    assert sorted(out) == sorted(by_completion[0]) and (err, counts) == by_completion[1:]
    ids = [json.loads(line)["custom_id"] for line in out]
    assert len(ids) == len(set(ids)) == counts["completed"] > 600
    assert [numbers[c] for c in ids] == sorted(numbers[c] for c in ids)
    assert not any(b"zombie" in line for line in out)
    assert err.count(b"\n") == counts["failed"] > 0
    if seed == 1:
        total = sum(len(services.adapters.blobs.get_bytes(k) or b"") for k in big)
        assert total > 2 * MIN_PART_BYTES and reads.ranged < total / 2  # shard 0's checkpoints copied, not read


def test_a_checkpoint_s_lines_are_written_in_input_order_with_their_numbers(services: Services) -> None:
    batch_id, [(shard_id, ids)] = planned_shards(services, 20, segment_max_lines=100, shard_target_tokens=10**6)
    [key] = write(services, batch_id, shard_id, "a", 0, [[answer(batch_id, ids[n], n, "") for n in (7, 2, 9, 4)]])
    summary = read_checkpoint_summary(services.adapters.blobs, key)
    assert summary is not None and summary.numbers == [2, 4, 7, 9] and summary.ascending() == [(0, 4)]
    data = services.adapters.blobs.get_bytes(key) or b""
    assert [json.loads(line)["custom_id"] for line in data.splitlines()] == [ids[n] for n in (2, 4, 7, 9)]


def test_shards_of_interleaved_lines_finishing_last_line_first_merge_into_input_order(services: Services) -> None:
    """Two long system prompts alternate: Plan keeps each prompt's lines in shards of their own (prefix-aware
    placement), so every shard's lines interleave with another's; each shard finishes its lines last first."""
    services.settings.pipeline.segment_max_lines = 20
    services.settings.pipeline.shard_target_tokens = 2_000
    systems = ["You are assistant A. " * 60, "You are assistant B. " * 60]  # over plan_prefix_chars each
    lines = [chat_line(i, messages=[{"role": "system", "content": systems[i % 2]},
                                    {"role": "user", "content": f"question {i}"}]) for i in range(160)]
    batch_id = make_batch(services, jsonl(lines), nightbatch={"output_order": "input"})
    inp = BatchTaskInput(batch_id=batch_id)
    assert validate_batch(inp, services).valid
    plan_batch(inp, services)
    blobs = services.adapters.blobs
    shards = [item.shard_id for item in read_manifest(blobs, batch_id)]
    numbers = {sid: [r.number for r in shard_requests_of(services, batch_id, sid)] for sid in shards}
    # A shard holds one prompt's lines: every other input line.
    assert len(shards) >= 2 and all(len({n % 2 for n in ns}) == 1 for ns in numbers.values())
    assert {ns[0] % 2 for ns in numbers.values()} == {0, 1}
    for sid in reversed(shards):  # the last shard finishes first, each shard its last line first
        reqs = list(reversed(shard_requests_of(services, batch_id, sid)))
        chunks = [reqs[i:i + 7] for i in range(0, len(reqs), 7)]
        write(services, batch_id, sid, "a", 0, [[answer(batch_id, r.custom_id, r.number, "x") for r in c]
                                                 for c in chunks])
        blobs.put_bytes(layout.done_key(batch_id, sid), b"{}")
    services.adapters.table.update(batch_id, set_={"status": "finalizing", "finalize_target": "completed"})
    assert finalize_batch(inp, services).status == "completed"
    batch = services.batches.get("default", batch_id)
    assert batch.model_dump()["nightbatch"]["output_order"] == "input"
    out = (blobs.get_bytes(layout.output_key(batch_id)) or b"").splitlines()
    assert [json.loads(line)["custom_id"] for line in out] == [f"req-{i}" for i in range(160)]


def test_an_attempt_s_last_lines_are_appended_to_its_previous_checkpoint_and_still_merge(services: Services) -> None:
    """The last write of an attempt (its shard's end, or a stop), too small for a part of its own, is appended
    to the attempt's previous, part-sized checkpoint (BlobStore.append): one object, copied by Finalize rather
    than uploaded again; its two stretches of line numbers merge into input order."""
    batch_id, [(shard_id, _)] = planned_shards(services, 120, segment_max_lines=1000, shard_target_tokens=10**9)
    reqs = shard_requests_of(services, batch_id, shard_id)
    blobs = services.adapters.blobs
    writer = Checkpointer(blobs=blobs, table=services.adapters.table, batch_id=batch_id,
                          prefix=layout.results_prefix(batch_id, shard_id), attempt="a", next_seq=0,
                          policy=CheckpointPolicy())
    writer.write([answer(batch_id, r.custom_id, r.number, "p" * 100_000) for r in reqs[0::2]])  # 6 MB
    writer.write([answer(batch_id, r.custom_id, r.number, "") for r in reqs[1::2]], last=True)  # 10 KB
    listed = blobs.list_keys(layout.results_prefix(batch_id, shard_id))
    [key] = [k for k in listed if layout.is_checkpoint(layout.results_prefix(batch_id, shard_id), k)]
    summary = read_checkpoint_summary(blobs, key)
    assert summary is not None and summary.ascending() == [(0, 60), (60, 120)] and summary.consistent()
    assert summary.size == blobs.size(key) and summary.etag == layout_etag(services, key)
    blobs.put_bytes(layout.done_key(batch_id, shard_id), b"{}")
    with Reads(blobs) as reads:
        out, err, counts = finalize(services, batch_id, "completion")
    assert reads.parsed == [] and reads.ranged < MIN_PART_BYTES  # copied, not read (but the failed lines)
    assert counts["total"] == 120 and err.count(b"\n") == counts["failed"] > 0
    by_input = finalize(services, batch_id, "input")
    assert sorted(by_input[0]) == sorted(out)
    numbers = {r.custom_id: r.number for r in reqs}
    got = [numbers[json.loads(line)["custom_id"]] for line in by_input[0]]
    assert got == sorted(got) and len(got) == counts["completed"]


def layout_etag(services: Services, key: str) -> str:
    return str(services.adapters.blobs.client.head_object(Bucket=services.adapters.blobs.bucket, Key=key)["ETag"])
