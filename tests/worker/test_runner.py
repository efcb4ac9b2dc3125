"""run_shard on moto with the deterministic test engine: results, errors, cadence, stops, resume."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from gpu_worker.engines.base import EngineFailedError, EngineReply
from gpu_worker.results import result_line
from gpu_worker.runner import ShardJob, ShardReport, run_shard
from gpu_worker.shard import load_shard
from nightbatch.ids import batch_request_id
from nightbatch.layout import checkpoint_key, done_key
from nightbatch.models.spec import LOCAL_MODELS, ModelSpec
from nightbatch.results.lines import read_checkpoint_summary, summarize_checkpoint
from nightbatch.settings import Settings
from tests.support.deterministic_engine import DeterministicEngine
from tests.support.openai_lines import BatchRequestOutput

from .conftest import CHAT_MODEL, EMBED_MODEL, ShardWorld, chat_requests

CHAT_SPEC = next(m for m in LOCAL_MODELS if m.name == CHAT_MODEL)
EMBED_SPEC = next(m for m in LOCAL_MODELS if m.name == EMBED_MODEL)


def run(
    world: ShardWorld, engine: DeterministicEngine, *, settings: Settings | None = None,
    stop: asyncio.Event | None = None, during: Any = None,
) -> ShardReport:
    """Runs the shard to its end; `during` is a coroutine function run alongside (to cancel, stop, ...)."""

    async def go() -> ShardReport:
        side = asyncio.create_task(during()) if during is not None else None
        try:
            return await run_shard(
                ShardJob(batch_id=world.batch_id, shard_id=world.shard_id), engine=engine,
                blobs=world.adapters.blobs, table=world.adapters.table, settings=settings or world.settings,
                stop=stop,
            )
        finally:
            if side is not None:
                side.cancel()
                await asyncio.gather(side, return_exceptions=True)

    return asyncio.run(go())


def assert_one_result_each(world: ShardWorld, custom_ids: list[str]) -> dict[str, dict[str, Any]]:
    results, duplicates = world.results()
    assert duplicates == 0
    assert sorted(results) == sorted(custom_ids)
    for custom_id, line in results.items():
        parsed = BatchRequestOutput.model_validate(line)
        assert parsed.id == batch_request_id(world.batch_id, custom_id)
        assert parsed.error is None and parsed.response is not None
        assert parsed.response.request_id.startswith("req_")
    return results


def test_every_line_gets_exactly_one_result(world: ShardWorld) -> None:
    ids = world.seed(chat_requests(120), per_segment=25)
    engine = DeterministicEngine(CHAT_SPEC, delay=0.002)
    report = run(world, engine)

    results = assert_one_result_each(world, ids)
    assert report.finished and report.stopped_reason is None
    assert (report.lines, report.done, report.skipped) == (120, 120, 0)
    assert (report.completed, report.failed) == (120, 0)
    assert all(line["response"]["status_code"] == 200 for line in results.values())
    assert all(line["response"]["body"]["object"] == "chat.completion" for line in results.values())
    # One engine request per line, and the request id the engine saw is the one in the result line.
    assert len(engine.received) == 120
    assert all("priority" not in body for _, body in engine.received)  # only a shared engine's requests have one
    marker = world.done_marker()
    assert marker is not None
    assert marker["lines"] == 120 and marker["attempts"] == 1
    assert marker["input_tokens"] == report.input_tokens > 0
    assert marker["output_tokens"] == report.output_tokens > 0
    assert set(marker) == {"lines", "model_load_seconds", "inference_seconds", "idle_seconds", "input_tokens",
                           "output_tokens", "attempts"}
    item = world.batch_item()
    assert item["live_completed"] == 120 and item["live_failed"] == 0
    assert item["live_input_tokens"] == report.input_tokens
    assert item["live_output_tokens"] == report.output_tokens
    assert time.time() - 60 < item["live_since"] <= time.time()  # set once, by the first counts
    # Lines are compact JSON.
    raw = world.adapters.blobs.get_bytes(world.checkpoint_keys()[0])
    assert raw is not None and b'", "' not in raw and b'": ' not in raw


def test_engine_stays_saturated_up_to_max_in_flight(world: ShardWorld) -> None:
    world.seed(chat_requests(64))
    engine = DeterministicEngine(CHAT_SPEC, delay=0.02)
    report = run(world, engine, settings=world.settings.updated({"max_in_flight": 8}))
    assert report.finished
    assert engine.peak_in_flight == 8


def test_engine_rejections_and_exceptions_become_error_lines(world: ShardWorld) -> None:
    requests = chat_requests(10)
    requests[2]["body"]["max_tokens"] = -1
    requests[5]["body"]["messages"][0]["content"] = "please FAIL"
    requests[7]["body"]["messages"][0]["content"] = "please RAISE"
    ids = world.seed(requests)
    report = run(world, DeterministicEngine(CHAT_SPEC))

    results = assert_one_result_each(world, ids)
    assert report.finished and (report.completed, report.failed) == (7, 3)
    for i in (2, 5):
        response = results[ids[i]]["response"]
        assert response["status_code"] == 400
        assert set(response["body"]["error"]) == {"message", "type", "param", "code"}
    crashed = results[ids[7]]["response"]
    assert crashed["status_code"] == 500
    assert crashed["body"]["error"]["type"] == "server_error"
    assert "deterministic engine asked to raise" in crashed["body"]["error"]["message"]
    item = world.batch_item()
    assert (item["live_completed"], item["live_failed"]) == (7, 3)


def test_default_max_tokens_applied_only_when_no_limit_is_given(world: ShardWorld) -> None:
    requests = chat_requests(4, max_tokens=None)
    requests[1]["body"]["max_tokens"] = 5
    requests[2]["body"]["max_completion_tokens"] = 7
    requests[3]["body"]["max_tokens"] = None
    world.seed(requests)
    engine = DeterministicEngine(CHAT_SPEC)
    run(world, engine)

    seen = {body["messages"][0]["content"]: body for _, body in engine.received}
    default = world.settings.serving.default_max_tokens
    assert seen["question 0"]["max_tokens"] == default
    assert seen["question 1"]["max_tokens"] == 5
    assert "max_tokens" not in seen["question 2"] and seen["question 2"]["max_completion_tokens"] == 7
    assert seen["question 3"]["max_tokens"] == default


def test_default_max_tokens_for_completions_but_not_embeddings(world: ShardWorld) -> None:
    world.seed([{"custom_id": "c", "body": {"model": CHAT_MODEL, "prompt": "Once upon"}}],
               endpoint="/v1/completions")
    engine = DeterministicEngine(CHAT_SPEC)
    run(world, engine)
    assert engine.received == [("/v1/completions", {"model": CHAT_MODEL, "prompt": "Once upon",
                                                    "max_tokens": world.settings.serving.default_max_tokens})]

    other = ShardWorld(settings=world.settings, adapters=world.adapters, batch_id=world.batch_id + "e")
    other.put_batch()
    ids = other.seed([{"custom_id": "e", "body": {"model": EMBED_MODEL, "input": ["a", "b"]}}],
                     endpoint="/v1/embeddings", model=EMBED_MODEL)
    embed_engine = DeterministicEngine(EMBED_SPEC)
    run(other, embed_engine)
    assert embed_engine.received == [("/v1/embeddings", {"model": EMBED_MODEL, "input": ["a", "b"]})]
    body = assert_one_result_each(other, ids)["e"]["response"]["body"]
    assert [d["index"] for d in body["data"]] == [0, 1]


def test_the_first_checkpoint_comes_early_then_each_holds_the_part_size(world: ShardWorld) -> None:
    """The cadence that writes output bytes once: the attempt's first checkpoint after `checkpoint_every_lines`
    lines (results while running show at once), every later one when `checkpoint_bytes` are buffered (in AWS
    S3's 5 MiB part minimum, so Finalize copies it), the last with the rest."""
    world.seed(chat_requests(120))
    limit = 12_000
    settings = world.settings.updated({
        "checkpoint_every_lines": 10, "checkpoint_every_seconds": 60.0, "checkpoint_bytes": limit,
        "checkpoint_max_seconds": 60.0, "max_in_flight": 1,
    })
    report = run(world, DeterministicEngine(CHAT_SPEC, delay=0.005), settings=settings)

    keys = world.checkpoint_keys()
    data = [world.adapters.blobs.get_bytes(k) or b"" for k in keys]
    lines = [d.count(b"\n") for d in data]
    line_bytes = max(len(x) for d in data for x in d.splitlines(keepends=True))
    assert report.checkpoints == len(keys) >= 4 and sum(lines) == 120
    assert 10 <= lines[0] <= 12 and len(data[0]) < limit
    assert all(limit <= len(d) < limit + 3 * line_bytes for d in data[1:-1])
    assert len(data[-1]) < limit + 3 * line_bytes
    # seq 000000, 000001, ... of one attempt.
    assert [k.rsplit("/", 1)[1] for k in keys] == [
        f"{i:06d}-{report.attempt}.jsonl" for i in range(len(keys))
    ]


def test_after_the_first_checkpoint_time_alone_waits_for_the_longer_bound(world: ShardWorld) -> None:
    """A slow shard whose buffer stays under the part size: one checkpoint `checkpoint_every_seconds` in, then
    one per `checkpoint_max_seconds` (not one per `checkpoint_every_seconds`), then the rest at its end."""
    world.seed(chat_requests(40))
    settings = world.settings.updated({
        "checkpoint_every_lines": 1000, "checkpoint_every_seconds": 0.1, "checkpoint_bytes": 1 << 30,
        "checkpoint_max_seconds": 0.5, "max_in_flight": 2,
    })
    started = time.monotonic()
    report = run(world, DeterministicEngine(CHAT_SPEC, delay=0.05), settings=settings)  # ~1 s of work
    elapsed = time.monotonic() - started
    assert report.finished
    assert 3 <= len(world.checkpoint_keys()) <= 2 + elapsed / 0.5


def test_live_counters_move_between_checkpoints(world: ShardWorld) -> None:
    """Progress stays fresh while checkpoints wait for the part size: the batch's live counters are added
    every `checkpoint_every_seconds` for the lines finished since, durable or not."""
    world.seed(chat_requests(60))
    settings = world.settings.updated({
        "checkpoint_every_lines": 5, "checkpoint_every_seconds": 0.1, "checkpoint_bytes": 1 << 30,
        "checkpoint_max_seconds": 60.0, "max_in_flight": 1,
    })
    seen: list[tuple[int, int]] = []  # (live_completed, checkpoints)

    async def watch() -> None:
        while True:
            item = await asyncio.to_thread(world.batch_item)
            seen.append((int(item.get("live_completed", 0)), len(world.checkpoint_keys())))
            await asyncio.sleep(0.05)

    report = run(world, DeterministicEngine(CHAT_SPEC, delay=0.02), settings=settings, during=watch)
    assert report.finished and len(world.checkpoint_keys()) == 2  # the first, and the rest at the end
    assert any(live >= 20 and checkpoints == 1 for live, checkpoints in seen), seen
    assert world.batch_item()["live_completed"] == 60


def test_each_checkpoint_has_its_summary(world: ShardWorld) -> None:
    """What Finalize counts from (nightbatch.results.lines.CheckpointSummary): the summary beside each checkpoint is
    what reading the checkpoint gives, error lines included."""
    requests = chat_requests(12)
    requests[4]["body"]["max_tokens"] = -1
    requests[9]["body"]["messages"][0]["content"] = "please RAISE"
    world.seed(requests)
    settings = world.settings.updated({"checkpoint_every_lines": 5, "checkpoint_every_seconds": 60.0,
                                       "max_in_flight": 1})
    run(world, DeterministicEngine(CHAT_SPEC), settings=settings)
    blobs = world.adapters.blobs
    failed = 0
    for key in world.checkpoint_keys():
        data = blobs.get_bytes(key) or b""
        summary = read_checkpoint_summary(blobs, key)
        assert summary is not None and summary.etag and summary.consistent()
        assert summary == summarize_checkpoint(data, etag=summary.etag, numbers=summary.numbers)
        assert summary.numbered() and len(summary.ascending()) == 1  # written in input order, numbers ascending
        assert summary.size == len(data) and len(summary.custom_ids) == len(world.checkpoint_lines(key))
        assert summary.input_tokens > 0 and summary.output_tokens > 0
        failed += len(summary.failed)
    assert failed == 2


def test_cancel_mid_run_stops_with_partial_results_and_no_done_marker(world: ShardWorld) -> None:
    ids = world.seed(chat_requests(200))
    engine = DeterministicEngine(CHAT_SPEC, delay=0.02)

    async def cancel_after_first_checkpoint() -> None:
        while not world.checkpoint_keys():
            await asyncio.sleep(0.02)
        await asyncio.to_thread(world.set_status, "cancelling")

    settings = world.settings.updated({"max_in_flight": 4})
    report = run(world, engine, settings=settings, during=cancel_after_first_checkpoint)

    assert not report.finished and report.stopped_reason == "cancelling"
    assert world.done_marker() is None
    results, duplicates = world.results()
    assert duplicates == 0 and 0 < len(results) < len(ids)
    # In-flight requests were allowed to finish: everything the engine was given has a durable result.
    assert len(engine.received) == len(results) == report.done


def test_a_shard_handed_over_loaded_waits_for_the_batch_s_first_read(world: ShardWorld) -> None:
    """The worker's entry hands run_shard the shard it checked before starting the engine; a batch cancelled
    while the engine started must get no request, however slowly its item is read."""
    world.seed(chat_requests(20))
    shard = load_shard(world.adapters.blobs, world.batch_id, world.shard_id)
    world.set_status("cancelling")
    engine = DeterministicEngine(CHAT_SPEC)
    events = world.adapters.table.table.meta.client.meta.events
    events.register("before-call.dynamodb.GetItem", lambda **_: time.sleep(0.3), unique_id="slow-batch-read")
    try:
        report = asyncio.run(run_shard(
            ShardJob(batch_id=world.batch_id, shard_id=world.shard_id), engine=engine, blobs=world.adapters.blobs,
            table=world.adapters.table, settings=world.settings, shard=shard))
    finally:
        events.unregister("before-call.dynamodb.GetItem", unique_id="slow-batch-read")
    assert not report.finished and report.stopped_reason == "cancelling"
    assert engine.received == [] and world.checkpoint_keys() == []


def test_expiry_stops_the_shard(world: ShardWorld) -> None:
    world.put_batch(expires_in=1.0)
    ids = world.seed(chat_requests(300))
    settings = world.settings.updated({"max_in_flight": 4})
    report = run(world, DeterministicEngine(CHAT_SPEC, delay=0.04), settings=settings)  # ~3 s of work

    assert not report.finished and report.stopped_reason == "expired"
    assert world.done_marker() is None
    results, duplicates = world.results()
    assert duplicates == 0 and len(results) < len(ids)


def test_stop_event_flushes_and_returns(world: ShardWorld) -> None:
    ids = world.seed(chat_requests(200))
    stop = asyncio.Event()

    async def stop_soon() -> None:
        await asyncio.sleep(0.3)
        stop.set()

    settings = world.settings.updated({"checkpoint_every_seconds": 60.0, "checkpoint_every_lines": 1000,
                                       "checkpoint_bytes": 1 << 30})
    engine = DeterministicEngine(CHAT_SPEC, delay=0.02)
    report = run(world, engine, settings=settings, stop=stop, during=stop_soon)

    assert report.stopped_reason == "sigterm" and not report.finished
    results, _ = world.results()
    # Nothing reached the cadence, yet everything finished is durable: the stop flushed it.
    assert 0 < len(results) == len(engine.received) < len(ids)


@pytest.mark.parametrize(
    "status", ["cancelling", "cancelled", "expired", "completed", "failed", "finalizing"]
)
def test_a_stopped_batch_runs_nothing(world: ShardWorld, status: str) -> None:
    world.seed(chat_requests(5))
    world.set_status(status)
    engine = DeterministicEngine(CHAT_SPEC)
    report = run(world, engine)
    assert not report.finished and report.stopped_reason is not None
    assert engine.received == [] and world.checkpoint_keys() == []


def test_a_done_shard_is_not_run_again(world: ShardWorld) -> None:
    world.seed(chat_requests(5))
    world.adapters.blobs.put_bytes(done_key(world.batch_id, world.shard_id), b"{}")
    engine = DeterministicEngine(CHAT_SPEC)
    report = run(world, engine)
    assert report.finished and report.stopped_reason is None and engine.received == []


def test_resume_skips_finished_custom_ids(world: ShardWorld) -> None:
    ids = world.seed(chat_requests(100), per_segment=30)
    earlier = {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    blobs = world.adapters.blobs
    # Two earlier attempts left checkpoints (seq 1 and 3; a gap is fine) for the first 20 lines.
    for seq, attempt, chunk in ((1, "0badcafe", ids[:12]), (3, "5eed5eed", ids[12:20])):
        lines = [
            result_line(world.batch_id, cid, f"req_{i}", EngineReply(200, {"usage": earlier})).data
            for i, cid in enumerate(chunk)
        ]
        blobs.put_bytes(checkpoint_key(world.prefix, seq, attempt), b"".join(lines))
    engine = DeterministicEngine(CHAT_SPEC)
    report = run(world, engine)

    assert report.finished and (report.skipped, report.done, report.lines) == (20, 80, 100)
    asked = {body["messages"][0]["content"] for _, body in engine.received}
    assert asked == {f"question {i}" for i in range(20, 100)}
    assert_one_result_each(world, ids)
    new_keys = [k for k in world.checkpoint_keys() if report.attempt in k]
    assert new_keys and all(int(k.rsplit("/", 1)[1][:6]) >= 4 for k in new_keys)
    marker = world.done_marker()
    assert marker is not None and marker["attempts"] == 3 and marker["lines"] == 100
    assert marker["input_tokens"] == 20 * 3 + report.input_tokens
    assert marker["output_tokens"] == 20 * 4 + report.output_tokens


class DyingEngine(DeterministicEngine):
    def __init__(self, spec: ModelSpec, *, survive: int) -> None:
        super().__init__(spec, delay=0.005)
        self.survive = survive

    async def handle(self, url: str, body: dict[str, Any], request_id: str) -> EngineReply:
        if len(self.received) >= self.survive:
            raise EngineFailedError("engine core died")
        return await super().handle(url, body, request_id)


def test_a_dead_engine_fails_the_attempt_without_writing_error_lines(world: ShardWorld) -> None:
    ids = world.seed(chat_requests(100))
    engine = DyingEngine(CHAT_SPEC, survive=30)
    with pytest.raises(EngineFailedError):
        run(world, engine)
    results, duplicates = world.results()
    assert duplicates == 0 and len(results) == 30 < len(ids)
    assert all(line["response"]["status_code"] == 200 for line in results.values())
    assert world.done_marker() is None


def test_result_lines_round_trip_as_json_lines(world: ShardWorld) -> None:
    world.seed(chat_requests(3))
    run(world, DeterministicEngine(CHAT_SPEC))
    for key in world.checkpoint_keys():
        raw = world.adapters.blobs.get_bytes(key)
        assert raw is not None
        for line in raw.splitlines():
            assert json.loads(line)["error"] is None


def test_cancelling_run_shard_leaves_no_task_behind(world: ShardWorld) -> None:
    world.seed(chat_requests(200))
    # Slow enough that the shard cannot finish before the cancel, however loaded the machine is.
    engine = DeterministicEngine(CHAT_SPEC, delay=5.0)

    async def go() -> list[asyncio.Task[Any]]:
        job = ShardJob(batch_id=world.batch_id, shard_id=world.shard_id)
        run = asyncio.create_task(run_shard(job, engine=engine, blobs=world.adapters.blobs,
                                            table=world.adapters.table, settings=world.settings))
        while not engine.received and not run.done():  # cancel mid-inference: requests are in the engine
            await asyncio.sleep(0.01)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        await asyncio.sleep(0.1)
        return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

    assert asyncio.run(go()) == []
    assert 0 < len(engine.received) < 200


class AbortAnsweringEngine(DeterministicEngine):
    """Like vLLM's serving layer: a request aborted mid-generation comes back as an error reply, not an
    exception."""

    async def handle(self, url: str, body: dict[str, Any], request_id: str) -> EngineReply:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return EngineReply(500, {"error": {"message": "aborted", "type": "server_error", "param": None,
                                               "code": None}})
        return await super().handle(url, body, request_id)


def test_requests_aborted_by_a_stop_leave_no_result_line(world: ShardWorld) -> None:
    world.seed(chat_requests(6))
    settings = world.settings.updated({"worker_drain_seconds": 0.2})

    async def cancel_soon() -> None:
        await asyncio.sleep(0.5)
        await asyncio.to_thread(world.set_status, "cancelling")

    report = run(world, AbortAnsweringEngine(CHAT_SPEC), settings=settings, during=cancel_soon)
    assert report.stopped_reason == "cancelling" and not report.finished
    # Unrun, so Finalize writes `batch_cancelled` for each rather than a bogus 500 line.
    assert world.results() == ({}, 0)


def test_a_shared_engine_gets_each_request_s_priority(world: ShardWorld) -> None:
    """On an engine several shards share (the local stack), each request carries the count of the attempt's
    earlier ones as its priority, so a small batch's first requests are served before a big one's backlog."""
    world.seed(chat_requests(12), per_segment=5)
    engine = DeterministicEngine(CHAT_SPEC)
    engine.priorities = True  # type: ignore[attr-defined]
    assert run(world, engine).finished
    assert sorted(body["priority"] for _, body in engine.received) == list(range(12))
