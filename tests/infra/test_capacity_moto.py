"""Deadline-aware capacity in the synthesized workflow on moto, with a controllable clock: priorities by deadline,
tenant share identifiers, Spot shortage and Spot interruption moving a batch to the on-demand queue."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import pytest

import nightbatch.clock
from gpu_worker.engines.base import EngineFailedError, EngineReply
from nightbatch import layout
from nightbatch.batches.request import CreateBatchRequest
from nightbatch.wiring import Services, default_services
from tests.infra.moto_workflow import (
    Deployment,
    JobRecord,
    wait_for_execution,
    worker_in_process,
)
from tests.infra.test_workflow_moto import (
    _clear_caches,
    _small_shards,
    chat_line,
    deploy_in_moto,
    execution_arn,
    jsonl,
)
from tests.support.deterministic_engine import DeterministicEngine

ENGINE = "tests.support.deterministic_engine:DeterministicEngine"
SPOT_SHORTAGE = "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY - Service cannot fulfill the capacity requested"
HOST_LOST = "Host EC2 (instance i-0123456789abcdef0) terminated."
SPOT_RUNNABLE_SECONDS = 30 * 60  # spotRunnableMinutes' default: what a refused Spot job waited


class Clock:
    """nightbatch.clock.now() = real time + offset (every module reads the time through it)."""

    def __init__(self) -> None:
        import time

        self.offset = 0.0
        self._time = time

    def time(self) -> float:
        return self._time.time() + self.offset

    def time_ns(self) -> int:
        return self._time.time_ns() + int(self.offset * 1e9)


@pytest.fixture
def deployment(template: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Iterator[Deployment]:
    yield from deploy_in_moto(template, monkeypatch)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(nightbatch.clock, "time", c)
    return c


class KillingEngine(DeterministicEngine):
    """Answers two requests of the first attempt it serves, then dies as if its Spot host were reclaimed."""

    kills_left = 1

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.answered = 0
        self.kill = KillingEngine.kills_left > 0
        KillingEngine.kills_left = 0

    async def handle(self, url: str, body: dict[str, Any], request_id: str) -> EngineReply:
        if self.kill and self.answered >= 2:
            raise EngineFailedError("simulated: the host went away")
        self.answered += 1
        return await super().handle(url, body, request_id)


def submit(tenant: str, lines: int, window: str) -> tuple[Services, str]:
    services = default_services()
    payload = jsonl([chat_line(i) for i in range(1, lines + 1)])
    file = services.files.create(tenant, filename="in.jsonl", purpose="batch", fileobj=io.BytesIO(payload),
                                 size=len(payload))
    batch = services.batches.create(tenant, CreateBatchRequest(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window=window))
    return services, batch.id


def jobs_of(d: Deployment, batch_id: str) -> list[JobRecord]:
    return [j for j in d.jobs if j.env.get("NIGHTBATCH_BATCH_ID") == batch_id]


def assert_each_line_once(services: Services, tenant: str, batch_id: str, lines: int) -> Any:
    batch = services.batches.get(tenant, batch_id)
    assert batch.status == "completed"
    out = read_file_of(services, tenant, batch.output_file_id)
    assert sorted(line["custom_id"] for line in out) == sorted(f"req-{i}" for i in range(1, lines + 1))
    assert batch.request_counts.model_dump() == {"total": lines, "completed": lines, "failed": 0}
    return batch


def read_file_of(services: Services, tenant: str, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    data = b"".join(services.files.chunks(services.files.item(tenant, file_id)))
    return [json.loads(line) for line in data.splitlines()]


def test_earlier_deadline_gets_higher_priority_and_jobs_carry_the_tenant_share(
        deployment: Deployment, monkeypatch: pytest.MonkeyPatch, clock: Clock) -> None:
    deployment.shard_runner = worker_in_process(monkeypatch, engine=ENGINE)
    services, big = submit("bigco", 6, "24h")
    _, urgent = submit("smallco7", 3, "1h")  # submitted behind the 24 h batch
    for batch_id in (big, urgent):
        assert wait_for_execution(execution_arn(deployment, batch_id))["status"] == "SUCCEEDED"
    big_jobs, urgent_jobs = jobs_of(deployment, big), jobs_of(deployment, urgent)
    assert big_jobs and urgent_jobs
    assert {j.share for j in big_jobs} == {"bigco"} and {j.share for j in urgent_jobs} == {"smallco7"}
    assert min(j.priority or 0 for j in urgent_jobs) > max(j.priority or 0 for j in big_jobs)
    assert {j.queue for j in big_jobs + urgent_jobs} == {"spot"}  # plenty of slack: Spot
    assert_each_line_once(services, "bigco", big, 6)
    assert_each_line_once(services, "smallco7", urgent, 3)


def test_spot_runnable_past_its_bound_moves_the_batch_on_demand_and_it_ends_in_its_window(
        deployment: Deployment, monkeypatch: pytest.MonkeyPatch, clock: Clock) -> None:
    _small_shards(monkeypatch)
    deployment.shard_runner = worker_in_process(monkeypatch, engine=ENGINE)

    def refuse(job: JobRecord) -> str | None:
        if job.queue != "spot":
            return None
        # The Spot queue cancelled the job after it sat RUNNABLE for its bound; concurrent ones waited together.
        clock.offset = max(clock.offset, SPOT_RUNNABLE_SECONDS)
        return SPOT_SHORTAGE

    deployment.refuse = refuse
    services, batch_id = submit("default", 24, "1h")  # 8 shards, 4 at a time (maxGpus)
    assert wait_for_execution(execution_arn(deployment, batch_id))["status"] == "SUCCEEDED"
    jobs = jobs_of(deployment, batch_id)
    shards = {j.shard_id for j in jobs}
    assert len(shards) > 4
    for shard in shards:
        runs = [j for j in jobs if j.shard_id == shard]
        assert [j.queue for j in runs if j.succeeded] == ["on-demand"], runs
        assert all(j.status_reason == SPOT_SHORTAGE for j in runs if j.queue == "spot")
    # After the first shortage the batch's remaining shards went straight to on-demand.
    assert sum(j.queue == "spot" for j in jobs) <= 4 < len(shards)
    batch = assert_each_line_once(services, "default", batch_id, 24)
    assert batch.completed_at is not None and batch.completed_at <= batch.expires_at
    decisions = batch.nightbatch["capacity"]
    assert {d["shard_id"] for d in decisions} == shards
    assert any(d["capacity"] == "on-demand" and "spot attempt ended: CAPACITY:" in d["reason"] for d in decisions)


def test_a_killed_spot_attempt_resumes_on_demand_without_lost_or_duplicated_lines(
        deployment: Deployment, monkeypatch: pytest.MonkeyPatch, clock: Clock) -> None:
    _small_shards(monkeypatch)
    KillingEngine.kills_left = 1
    deployment.shard_runner = worker_in_process(monkeypatch, engine="tests.infra.test_capacity_moto:KillingEngine")
    deployment.failure_reason = lambda job: HOST_LOST if job.queue == "spot" else None
    services, batch_id = submit("default", 12, "24h")
    assert wait_for_execution(execution_arn(deployment, batch_id))["status"] == "SUCCEEDED"
    jobs = jobs_of(deployment, batch_id)
    (killed,) = [j for j in jobs if not j.succeeded]
    assert killed.queue == "spot" and killed.status_reason == HOST_LOST
    resumed = [j for j in jobs if j.shard_id == killed.shard_id and j.succeeded]
    assert [j.queue for j in resumed] == ["on-demand"]
    marker = json.loads(services.adapters.blobs.get_bytes(
        layout.results_prefix(batch_id, killed.shard_id) + "_done.json") or b"{}")
    assert marker["attempts"] == 2  # the killed attempt's checkpointed lines were kept, not rerun
    batch = assert_each_line_once(services, "default", batch_id, 12)
    out = read_file_of(services, "default", batch.output_file_id)
    assert len(out) == len({line["custom_id"] for line in out}) == 12


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    _clear_caches()
    yield
    _clear_caches()
