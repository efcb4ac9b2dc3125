"""The worker's image fetches (gpu_worker/images.py): a repeated reference is fetched once a line; the images of a
line are bounded in total (that line's 400) and those of the lines in flight share a byte budget (a wait, not an
error, unless one line alone needs more); a transient S3 failure is tried again with backoff, a bounded number of
times, and never becomes a 500 carrying an exception's text; a permanent one is the line's 400 at once."""

from __future__ import annotations

import asyncio
import base64
from collections import Counter, deque
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from botocore.exceptions import ConnectionClosedError

from gpu_worker.images import ByteBudget
from nightbatch.settings import Settings
from tests.support.deterministic_engine import DeterministicEngine

from .conftest import CHAT_MODEL, ShardWorld
from .test_runner import CHAT_SPEC, run

BUCKET = "users-images"
PNG = b"\x89PNG\r\n\x1a\n" + bytes(392)  # 400 bytes


class S3Calls:
    """The worker's S3 calls, counted by operation and key name ("GetObject cat.png"); `fail` answers the next
    calls of one on a key with S3 errors (status, code) or raises network failures, as S3 or the network would,
    before any reach the (mocked) bucket."""

    def __init__(self, client: Any) -> None:
        self.events = client.meta.events
        self.counts: Counter[str] = Counter()
        self.failures: dict[tuple[str, str], deque[tuple[int, str] | Exception]] = {}

    def fail(self, operation: str, key: str, *failures: tuple[int, str] | Exception) -> None:
        self.failures.setdefault((operation, key), deque()).extend(failures)

    def _before(self, model: Any, params: dict[str, Any], **_: Any) -> Any:
        path = str(params.get("url_path", "")).split("?")[0]
        self.counts[f"{model.name} {path.rsplit('/', 1)[-1]}"] += 1
        queue = next((q for (op, key), q in self.failures.items() if op == model.name and path.endswith("/" + key)),
                     None)
        if not queue:
            return None
        failure = queue.popleft()
        if isinstance(failure, Exception):
            raise failure
        status, code = failure
        return SimpleNamespace(status_code=status, headers={}, content=b""), {
            "Error": {"Code": code, "Message": "injected"}, "ResponseMetadata": {"HTTPStatusCode": status}}

    def __enter__(self) -> S3Calls:
        self.events.register_first("before-call.s3", self._before)
        return self

    def __exit__(self, *_: object) -> None:
        self.events.unregister("before-call.s3", self._before)


@pytest.fixture
def s3_calls(world: ShardWorld) -> Iterator[S3Calls]:
    with S3Calls(world.adapters.blobs.client) as calls:
        yield calls


def images_bucket(world: ShardWorld, **objects: bytes) -> Settings:
    s3 = world.adapters.client("s3")
    if not any(b["Name"] == BUCKET for b in s3.list_buckets()["Buckets"]):
        s3.create_bucket(Bucket=BUCKET)
    for key, data in objects.items():
        s3.put_object(Bucket=BUCKET, Key=key, Body=data, ContentType="image/png")
    settings = world.settings.model_copy(deep=True)
    settings.files.user_input_buckets = BUCKET
    return settings


def images_line(custom_id: str, *keys: str) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": "compare them"}]
    parts += [{"type": "image_url", "image_url": {"url": f"s3://{BUCKET}/{key}"}} for key in keys]
    return {"custom_id": custom_id, "body": {"model": CHAT_MODEL, "max_tokens": 8,
                                             "messages": [{"role": "user", "content": parts}]}}


def data_url(data: bytes) -> str:
    return f"data:image/png;base64,{base64.b64encode(data).decode()}"


def test_a_repeated_reference_is_fetched_once_a_line(world: ShardWorld, s3_calls: S3Calls) -> None:
    settings = images_bucket(world, **{"cat.png": PNG})
    world.seed([images_line("eight", *["cat.png"] * 8)])
    engine = DeterministicEngine(CHAT_SPEC)
    run(world, engine, settings=settings)
    (_, body), = engine.received
    assert [p["image_url"]["url"] for p in body["messages"][0]["content"][1:]] == [data_url(PNG)] * 8
    assert s3_calls.counts["GetObject cat.png"] == 1


def test_the_images_of_a_line_are_bounded_in_total_each_counted_once(world: ShardWorld) -> None:
    settings = images_bucket(world, **{"a.png": PNG, "b.png": PNG, "c.png": PNG})
    settings.validation.max_image_bytes_per_request = 1000
    world.seed([images_line("same", "a.png", "a.png", "a.png"), images_line("three", "a.png", "b.png", "c.png")])
    engine = DeterministicEngine(CHAT_SPEC)
    run(world, engine, settings=settings)
    results, _ = world.results()
    assert results["same"]["response"]["status_code"] == 200
    three = results["three"]["response"]
    assert three["status_code"] == 400
    assert three["body"]["error"] == {
        "message": "The images this request names total 1200 bytes (each counted once), over the limit of 1000 "
                   "bytes per request.",
        "type": "invalid_request_error", "param": "body.messages[0].content[3].image_url.url",
        "code": "image_too_large"}
    assert len(engine.received) == 1


def test_the_lines_in_flight_share_the_workers_image_budget(world: ShardWorld) -> None:
    """With room for one line's images at a time, the lines naming images reach the engine one by one (each
    waits for its share) and all succeed; a line needing more than the whole budget is refused."""
    settings = images_bucket(world, **{"a.png": PNG, "b.png": PNG, "big.png": PNG * 3})
    settings.worker.image_bytes_in_flight = 1000
    world.seed([images_line(f"img-{i}", "a.png", "b.png") for i in range(4)] + [images_line("alone", "big.png")])
    engine = DeterministicEngine(CHAT_SPEC, delay=0.05)
    run(world, engine, settings=settings)
    results, _ = world.results()
    assert all(results[f"img-{i}"]["response"]["status_code"] == 200 for i in range(4))
    assert engine.peak_in_flight == 1  # max_in_flight is 8: the budget, not the in-flight cap, held them
    alone = results["alone"]["response"]
    assert (alone["status_code"], alone["body"]["error"]["code"]) == (400, "image_too_large")
    assert alone["body"]["error"]["message"] == ("The images this request names total 1200 bytes, more than this "
                                                 "worker holds for images at once (1000 bytes).")


def test_a_transient_failure_is_tried_again(world: ShardWorld, s3_calls: S3Calls) -> None:
    """Throttled twice, then served: the line succeeds (default attempts and backoff); a connection closed
    under a HEAD likewise."""
    settings = images_bucket(world, **{"cat.png": PNG})
    s3_calls.fail("GetObject", "cat.png", (503, "SlowDown"), (500, "InternalError"))
    s3_calls.fail("HeadObject", "cat.png", ConnectionClosedError(endpoint_url="https://s3.amazonaws.com"))
    world.seed([images_line("throttled", "cat.png")])
    engine = DeterministicEngine(CHAT_SPEC)
    run(world, engine, settings=settings)
    results, _ = world.results()
    assert results["throttled"]["response"]["status_code"] == 200
    assert s3_calls.counts["GetObject cat.png"] == 3 and s3_calls.counts["HeadObject cat.png"] == 2
    (_, body), = engine.received
    assert body["messages"][0]["content"][1]["image_url"]["url"] == data_url(PNG)


def test_transient_failures_past_the_attempts_and_permanent_ones_are_the_lines_clear_errors(
        world: ShardWorld, s3_calls: S3Calls) -> None:
    settings = images_bucket(world, **{"cat.png": PNG, "locked.png": PNG})
    settings.worker.image_fetch_attempts = 3
    settings.worker.image_fetch_backoff_seconds = 0.001
    settings.worker.max_in_flight = 1
    s3_calls.fail("GetObject", "cat.png", *[(503, "SlowDown")] * 3)
    s3_calls.fail("GetObject", "locked.png", (403, "AccessDenied"))
    world.seed([images_line("throttled", "cat.png"), images_line("denied", "locked.png")])
    run(world, DeterministicEngine(CHAT_SPEC), settings=settings)
    # The throttled one asked its 3 times; a permanent answer is not asked again.
    assert (s3_calls.counts["GetObject cat.png"], s3_calls.counts["GetObject locked.png"]) == (3, 1)
    results, _ = world.results()
    assert results["throttled"]["response"] == {"status_code": 503, "request_id": results["throttled"]["response"][
        "request_id"], "body": {"error": {
            "message": f"The image s3://{BUCKET}/cat.png could not be read: S3 failed 3 times (SlowDown). Retry the "
                       "line later.",
            "type": "server_error", "param": "body.messages[0].content[1].image_url.url",
            "code": "image_unavailable"}}}
    denied = results["denied"]["response"]
    assert (denied["status_code"], denied["body"]["error"]["code"]) == (400, "invalid_image")
    assert denied["body"]["error"]["message"] == f"The image s3://{BUCKET}/locked.png could not be read (AccessDenied)."


def test_the_budget_serves_lines_in_order_and_a_cancelled_wait_gives_way() -> None:
    async def go() -> list[str]:
        budget, order = ByteBudget(10), []

        async def line(name: str, n: int, hold: float) -> None:
            async with budget.hold(n):
                order.append(name)
                await asyncio.sleep(hold)

        first = asyncio.create_task(line("first", 8, 0.05))
        await asyncio.sleep(0)
        cancelled = asyncio.create_task(line("cancelled", 6, 0))
        later = asyncio.create_task(line("later", 2, 0))  # fits now, but waits its turn behind "cancelled"
        await asyncio.sleep(0.01)
        assert order == ["first"]
        cancelled.cancel()
        await asyncio.gather(first, later, return_exceptions=True)
        assert budget.free == 10
        return order

    assert asyncio.run(go()) == ["first", "later"]
