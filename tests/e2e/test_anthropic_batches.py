"""The real `anthropic` SDK drives Message Batches through `nightbatch local` on the real CPU engine: create,
poll, stream results, list pages, delete, a malformed request, cancel mid-run, another tenant's batch."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import anthropic
import httpx
import pytest
from anthropic.types.messages import MessageBatch

from tests.e2e.conftest import LocalStack
from tests.support.local_stack import ROOT

pytestmark = pytest.mark.e2e
CHAT = "SmolLM2-135M-Instruct"


def claude(stack: LocalStack, key: str | None = None) -> anthropic.Anthropic:
    # The SDK adds /v1/messages/batches to the host itself.
    return anthropic.Anthropic(base_url=stack.base_url.removesuffix("/v1"), api_key=key or stack.api_key,
                               max_retries=0)


def ask(custom_id: str, content: Any, **params: Any) -> dict[str, Any]:
    messages = content if isinstance(content, list) else [{"role": "user", "content": content}]
    return {"custom_id": custom_id, "params": {"model": CHAT, "max_tokens": 8, "temperature": 0,
                                               "messages": messages, **params}}


def wait_ended(client: anthropic.Anthropic, batch_id: str, timeout: float = 600) -> MessageBatch:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        b = client.messages.batches.retrieve(batch_id)
        if b.processing_status == "ended":
            return b
        time.sleep(1)
    raise AssertionError(f"message batch {batch_id} still {b.processing_status} after {timeout} s")


def results(client: anthropic.Anthropic, batch_id: str) -> dict[str, Any]:
    rows = list(client.messages.batches.results(batch_id))
    assert len(rows) == len({r.custom_id for r in rows})
    return {r.custom_id: r.result for r in rows}


def test_create_poll_results_list_and_delete(local_stack: LocalStack) -> None:
    client = claude(local_stack)
    requests = [
        ask("system", "Name a colour.", system="You answer in one word."),
        ask("turns", [{"role": "user", "content": "My name is Ada."}, {"role": "assistant", "content": "Hello Ada!"},
                      {"role": "user", "content": "What is my name?"}]),
        ask("stops", "Count: 1, 2, 3, 4, 5, 6", stop_sequences=[","], max_tokens=16),
        ask("too-long", "word " * 3000),  # longer than the model's context: the engine refuses it
    ]
    created = client.messages.batches.create(requests=requests)  # type: ignore[arg-type]
    assert created.processing_status == "in_progress" and created.request_counts.processing == 4
    done = wait_ended(client, created.id)
    assert done.request_counts.model_dump() == {"processing": 0, "succeeded": 3, "errored": 1, "canceled": 0,
                                                "expired": 0}
    assert done.ended_at is not None and done.results_url
    got = results(client, done.id)
    assert set(got) == {"system", "turns", "stops", "too-long"}
    for custom_id in ("system", "turns", "stops"):
        result = got[custom_id]
        assert result.type == "succeeded", result
        msg = result.message
        assert msg.id.startswith("msg_") and msg.type == "message" and msg.role == "assistant"
        assert msg.model == CHAT and msg.content[0].type == "text"
        assert msg.usage.input_tokens > 0 and 0 < msg.usage.output_tokens <= 16
        assert msg.stop_reason in ("end_turn", "max_tokens", "stop_sequence")
    assert "," not in got["stops"].message.content[0].text
    assert got["too-long"].type == "errored"
    assert got["too-long"].error.error.type == "invalid_request_error"

    page = client.messages.batches.list(limit=1)
    assert [b.id for b in page.data] == [done.id] and page.last_id == done.id
    assert client.messages.batches.delete(done.id).type == "message_batch_deleted"
    with pytest.raises(anthropic.NotFoundError):
        client.messages.batches.retrieve(done.id)


def test_malformed_request_gets_anthropics_error(local_stack: LocalStack) -> None:
    client = claude(local_stack)
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.batches.create(requests=[{"custom_id": "a", "params": {  # type: ignore[typeddict-item]
            "model": CHAT, "messages": [{"role": "user", "content": "hi"}]}}])
    body = info.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"] == {"type": "invalid_request_error", "message": "requests.0.params.max_tokens: Field required"}


def finished_lines(stack: LocalStack, message_batch_id: str) -> int:
    """Finished requests so far, from the partial results (a Message Batch counts none until it ends)."""
    batch_id = "batch_" + message_batch_id.removeprefix("msgbatch_")
    r = httpx.get(f"{stack.base_url}/nightbatch/batches/{batch_id}/results",
                  headers={"Authorization": f"Bearer {stack.api_key}"}, timeout=30)
    r.raise_for_status()
    return int(r.headers["x-nightbatch-count"])


def test_cancel_mid_run_cancels_the_unrun_requests(local_stack: LocalStack) -> None:
    client = claude(local_stack)
    # Two short requests finish at once; the long ones are still running when the cancel arrives.
    requests = [ask(f"short-{i}", "Hi", max_tokens=2) for i in range(2)] + [
        ask(f"long-{i}", f"Count from {i} to 5000, one number per line.", max_tokens=1500) for i in range(10)]
    created = client.messages.batches.create(requests=requests)  # type: ignore[arg-type]
    deadline = time.monotonic() + 300
    while finished_lines(local_stack, created.id) < 1 and time.monotonic() < deadline:
        time.sleep(0.3)
    canceling = client.messages.batches.cancel(created.id)
    assert canceling.processing_status in ("canceling", "ended") and canceling.cancel_initiated_at is not None
    done = wait_ended(client, created.id)
    counts = done.request_counts
    assert counts.processing == 0 and counts.succeeded + counts.errored + counts.canceled == 12
    assert counts.succeeded >= 1 and counts.canceled >= 1 and counts.expired == 0
    got = results(client, done.id)
    assert len(got) == 12
    assert sum(1 for r in got.values() if r.type == "canceled") == counts.canceled
    assert sum(1 for r in got.values() if r.type == "succeeded") == counts.succeeded


def test_another_tenants_batch_is_not_found(local_stack: LocalStack) -> None:
    assert local_stack.state is not None
    env = {**os.environ, "XDG_STATE_HOME": str(local_stack.state.parent.parent), "PYTHONPATH": str(ROOT)}
    made = subprocess.run([sys.executable, "-m", "nightbatch", "keys", "create", "--name", "anthropic-e2e",
                           "--tenant", "other-team"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    ours, theirs = claude(local_stack), claude(local_stack, made.stdout.strip())
    mb = ours.messages.batches.create(requests=[ask("one", "Hi", max_tokens=2)])  # type: ignore[arg-type]
    for call in (lambda: theirs.messages.batches.retrieve(mb.id), lambda: theirs.messages.batches.cancel(mb.id),
                 lambda: theirs.messages.batches.delete(mb.id)):
        with pytest.raises(anthropic.NotFoundError) as info:
            call()
        assert isinstance(info.value.body, dict) and info.value.body["error"]["type"] == "not_found_error"
    assert all(b.id != mb.id for b in theirs.messages.batches.list())
    wait_ended(ours, mb.id)
