"""One machine, several batches (the local stack): a small batch submitted behind a big one finishes first.

The big batch sends more requests than the engine runs at once (the worker keeps two per sequence slot in
flight), so under first-come-first-served its backlog sits ahead of the small batch's few lines (a 400-line
batch of long answers held a concurrent 4-line one for 10 minutes). The shared engine now schedules by
priority, each request's being its place in its own shard (gpu_worker.runner; the runner's own test pins the
priorities). At this test's size the previous scheduling also lets the small batch through first on this
machine (its wait is about one wave of the big batch's requests); the test holds the behaviour users see."""

from __future__ import annotations

import time

import pytest

from tests.e2e.conftest import LocalStack
from tests.e2e.sdk import submit, wait, wait_for_a_result

pytestmark = pytest.mark.e2e
CHAT = "SmolLM2-135M-Instruct"


def chat(prefix: str, i: int, max_tokens: int) -> dict[str, object]:
    return {"custom_id": f"{prefix}-{i}", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": CHAT, "messages": [{"role": "user", "content": f"Count to {i}."}], "temperature": 0,
                     "max_tokens": max_tokens, "ignore_eos": True}}


def test_a_small_batch_behind_a_big_one_finishes_first(local_stack: LocalStack) -> None:
    client = local_stack.client()
    big = submit(client, [chat("big", i, 12) for i in range(700)], "/v1/chat/completions")
    wait_for_a_result(client, big.id)  # the big batch holds the engine, its backlog queued
    small = submit(client, [chat("small", i, 4) for i in range(3)], "/v1/chat/completions")
    started = time.monotonic()
    done = wait(client, small.id)
    took = time.monotonic() - started
    behind = client.batches.retrieve(big.id)
    try:
        assert done.status == "completed" and done.request_counts is not None
        assert done.request_counts.completed == 3
        assert behind.status == "in_progress", f"the small batch took {took:.0f} s and ended after the big one"
        assert behind.request_counts is not None and behind.request_counts.completed < 700
    finally:
        client.batches.cancel(big.id)
        wait(client, big.id)
