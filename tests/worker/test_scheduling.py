"""Submission order (gpu_worker/scheduling.py): prefix groups, length order, bounded windows, and the runner
still giving exactly one result per line with it, across a resume. Deterministic engine; no timings asserted."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from typing import Any

from gpu_worker.runner import ShardJob, ShardReport, run_shard
from gpu_worker.scheduling import OrderPolicy, in_flight_limit, order_window, ordered
from nightbatch.models.spec import LOCAL_MODELS
from nightbatch.pipeline.prefixes import prompt_text
from nightbatch.settings import Settings
from nightbatch.validation.line import RequestLine
from tests.support.deterministic_engine import DeterministicEngine

from .conftest import CHAT_MODEL, ShardWorld

CHAT_SPEC = next(m for m in LOCAL_MODELS if m.name == CHAT_MODEL)
SYSTEMS = [f"System prompt {name}: " + "follow the house style guide. " * 20 for name in "ABC"]


def mixed_requests(n: int, seed: int = 3) -> list[dict[str, Any]]:
    """Half share one of three long system prompts, the rest share nothing; shuffled together."""
    rng = random.Random(seed)
    requests = []
    for i in range(n):
        user = {"role": "user", "content": f"q{i} " + "word " * rng.randint(1, 40)}
        messages = [{"role": "system", "content": SYSTEMS[i % 3]}, user] if i % 2 == 0 else [user]
        requests.append({"custom_id": f"m-{i:04d}", "body": {"model": CHAT_MODEL, "messages": messages,
                                                            "max_tokens": 4}})
    rng.shuffle(requests)
    return requests


def pending(requests: list[dict[str, Any]]) -> list[RequestLine]:
    return [RequestLine(i + 1, r["custom_id"], r["body"], 0) for i, r in enumerate(requests)]


def system_of(body: dict[str, Any]) -> str | None:
    first = body["messages"][0]
    return str(first["content"]) if first["role"] == "system" else None


def runs_of(keys: list[Any]) -> int:
    """How many maximal runs of equal adjacent keys."""
    return sum(1 for i, k in enumerate(keys) if i == 0 or k != keys[i - 1])


def test_grouping_puts_shared_prefix_requests_next_to_each_other() -> None:
    window = pending(mixed_requests(90))
    before = [system_of(p.body) for p in window if system_of(p.body)]
    out = order_window(window, OrderPolicy(group_prefixes=True, length_order="none"))

    assert sorted(p.custom_id for p in out) == sorted(p.custom_id for p in window)
    shared = [system_of(p.body) for p in out if system_of(p.body)]
    assert runs_of(before) > 3  # the input interleaves them
    assert runs_of(shared) == 3  # each system prompt's requests form one contiguous run
    # ...and are contiguous in the full order, not only among themselves.
    positions = {s: [i for i, p in enumerate(out) if system_of(p.body) == s] for s in SYSTEMS}
    assert all(pos == list(range(pos[0], pos[0] + len(pos))) for pos in positions.values())


def test_length_order_longest_first_within_groups_and_across_them() -> None:
    window = pending(mixed_requests(90))
    out = order_window(window, OrderPolicy(group_prefixes=True, length_order="longest"))
    lengths = [len(prompt_text(p.body)) for p in out]

    for s in SYSTEMS:
        members = [len(prompt_text(p.body)) for p in out if system_of(p.body) == s]
        assert members == sorted(members, reverse=True)
    # Groups go in the order of their longest member, so each group starts with the longest prompt left.
    group = [system_of(p.body) or p.custom_id for p in out]
    starts = [i for i in range(len(out)) if i == 0 or group[i] != group[i - 1]]
    assert len(starts) == 3 + 45
    assert all(lengths[i] == max(lengths[i:]) for i in starts)


def test_length_order_without_grouping_sorts_the_window_and_none_keeps_input_order() -> None:
    window = pending(mixed_requests(60))
    longest = order_window(window, OrderPolicy(group_prefixes=False, length_order="longest"))
    shortest = order_window(window, OrderPolicy(group_prefixes=False, length_order="shortest"))
    kept = order_window(window, OrderPolicy(group_prefixes=False, length_order="none"))

    assert [len(prompt_text(p.body)) for p in longest] == sorted((len(prompt_text(p.body)) for p in window),
                                                                 reverse=True)
    assert [len(prompt_text(p.body)) for p in shortest] == sorted(len(prompt_text(p.body)) for p in window)
    assert kept == window


def test_prompt_text_covers_chat_parts_completions_and_embeddings() -> None:
    chat = {"messages": [{"role": "system", "content": "S"},
                         {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
            "tools": [{"type": "function", "function": {"name": "f"}}]}
    text = prompt_text(chat)
    assert text.startswith('[{"function":{"name":"f"}') and "system\nS" in text and text.endswith("user\na\nb")
    assert prompt_text({"prompt": "once upon"}) == "once upon"
    assert prompt_text({"input": ["x", "y"]}) == "x\ny"
    assert prompt_text({"prompt": [1, 2, 3]}) == "1\n2\n3"


class CountingSource:
    """An iterator that records how far ahead of the consumer it has been read."""

    def __init__(self, items: list[RequestLine]) -> None:
        self.items = items
        self.pulled = 0

    def __iter__(self) -> Iterator[RequestLine]:
        for item in self.items:
            self.pulled += 1
            yield item


def test_windows_bound_how_far_ahead_lines_are_read() -> None:
    source = CountingSource(pending(mixed_requests(1000)))
    policy = OrderPolicy(window_lines=64)
    seen: list[str] = []
    ahead = 0
    for request in ordered(source, policy):
        if not seen:
            # The next window is read ahead without the consumer asking for it.
            deadline = time.monotonic() + 10
            while source.pulled < 2 * policy.window_lines and time.monotonic() < deadline:
                time.sleep(0.001)
            assert source.pulled == 2 * policy.window_lines
        seen.append(request.custom_id)
        ahead = max(ahead, source.pulled - len(seen))

    assert sorted(seen) == sorted(p.custom_id for p in source.items) and len(set(seen)) == 1000
    # The window being handed out plus the one read ahead: never more.
    assert ahead <= 2 * policy.window_lines


def test_the_char_bound_closes_a_window_early() -> None:
    requests = pending(mixed_requests(200))
    size = {p.custom_id: len(prompt_text(p.body)) for p in requests}
    longest = max(size.values())
    pulled_chars = 0

    def source() -> Iterator[RequestLine]:
        nonlocal pulled_chars
        for p in requests:
            pulled_chars += size[p.custom_id]
            yield p

    policy = OrderPolicy(window_lines=10_000, window_chars=5 * longest)
    seen: list[str] = []
    ahead = 0
    for request in ordered(source(), policy):
        seen.append(request.custom_id)
        ahead = max(ahead, pulled_chars - sum(size[c] for c in seen))
    assert sorted(seen) == sorted(size)
    # Two windows, each closed by the request that crossed the bound.
    assert 0 < ahead <= 2 * (policy.window_chars + longest)


def test_window_zero_is_input_order_without_read_ahead() -> None:
    requests = pending(mixed_requests(50))
    source = CountingSource(requests)
    out = []
    for request in ordered(source, OrderPolicy(window_lines=0)):
        out.append(request)
        assert source.pulled == len(out)
    assert out == requests


def test_in_flight_floor_follows_the_engine_sequence_slots() -> None:
    class Slots:
        max_num_seqs = 1024

    settings = Settings(worker={"max_in_flight": 256, "in_flight_per_slot": 2.0})
    assert in_flight_limit(settings, Slots()) == 2048
    assert in_flight_limit(settings, object()) == 256  # an engine that does not say keeps max_in_flight
    assert in_flight_limit(settings.updated({"worker_in_flight_per_slot": 0.0}), Slots()) == 256
    assert in_flight_limit(Settings(worker={"max_in_flight": 4096}), Slots()) == 4096


def run(world: ShardWorld, engine: DeterministicEngine, settings: Settings,
        stop: asyncio.Event | None = None, stop_after: int | None = None) -> ShardReport:
    async def go() -> ShardReport:
        async def watch() -> None:
            while stop is not None and stop_after is not None and len(engine.received) < stop_after:
                await asyncio.sleep(0.005)
            if stop is not None:
                stop.set()

        side = asyncio.create_task(watch()) if stop is not None else None
        try:
            return await run_shard(ShardJob(batch_id=world.batch_id, shard_id=world.shard_id), engine=engine,
                                   blobs=world.adapters.blobs, table=world.adapters.table, settings=settings,
                                   stop=stop)
        finally:
            if side is not None:
                side.cancel()
                await asyncio.gather(side, return_exceptions=True)

    return asyncio.run(go())


def test_the_runner_submits_groups_together_and_answers_every_line_once(world: ShardWorld) -> None:
    requests = mixed_requests(150)
    ids = world.seed(requests, per_segment=40)
    engine = DeterministicEngine(CHAT_SPEC, delay=0.002)
    settings = world.settings.updated({"worker_order_window_lines": 200, "max_in_flight": 8})
    report = run(world, engine, settings)

    assert report.finished and report.done == 150 and report.running_seconds > 0
    results, duplicates = world.results()
    assert duplicates == 0 and sorted(results) == sorted(ids)
    submitted = [system_of(body) for _, body in engine.received]
    assert runs_of([s for s in submitted if s]) == 3
    assert runs_of([s for s in (system_of(r["body"]) for r in requests) if s]) > 3


def test_resume_with_ordering_skips_what_an_earlier_attempt_finished(world: ShardWorld) -> None:
    ids = world.seed(mixed_requests(160), per_segment=50)
    settings = world.settings.updated({
        "worker_order_window_lines": 48, "max_in_flight": 4, "checkpoint_every_lines": 5,
    })
    first_engine = DeterministicEngine(CHAT_SPEC, delay=0.005)
    first = run(world, first_engine, settings, stop=asyncio.Event(), stop_after=60)
    assert not first.finished and first.stopped_reason == "sigterm"
    done_first, _ = world.results()
    assert 0 < len(done_first) < len(ids)

    second_engine = DeterministicEngine(CHAT_SPEC, delay=0.001)
    second = run(world, second_engine, settings)

    assert second.finished and second.skipped == len(done_first)
    assert second.done == len(ids) - len(done_first)
    asked_again = {body["messages"][-1]["content"].split()[0] for _, body in second_engine.received}
    finished_before = {line["custom_id"] for line in done_first.values()}
    assert not asked_again & {f"q{int(cid.split('-')[1])}" for cid in finished_before}
    results, duplicates = world.results()
    assert duplicates == 0 and sorted(results) == sorted(ids)
