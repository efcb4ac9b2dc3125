"""The endpoint backend against a real OpenAI-compatible vLLM server (the session's `vllm serve` of the chat model,
with priority scheduling and an API key, behind a small proxy in the test that records what passes and can shed
load): `nightbatch local` pointed at it with NIGHTBATCH_MODELS_JSON, driven by the OpenAI SDK, and the worker's
entry (`python -m gpu_worker`, NIGHTBATCH_BACKEND=endpoint) killed mid-shard.

No timing assertions: every wait is a bound for a hang; what is asserted is which lines ended where, what the
server was sent, and what the admission did (its own log line)."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
from openai import OpenAI

from bench.vllm_server import API_KEY as FLEET_KEY
from bench.vllm_server import SERVED_NAME, VllmServer
from nightbatch.aws import Adapters
from nightbatch.ids import new_batch_id
from tests.e2e.conftest import LocalStack
from tests.e2e.sdk import submit, wait, wait_for_a_result
from tests.support.endpoint_proxy import EndpointProxy, running_proxy
from tests.support.local_stack import API_KEY, running_local
from tests.worker.conftest import WORKER_OVERRIDES, ShardWorld
from tests.worker.processes import checkpoints_reach, spawn, wait_until, worker_env

pytestmark = pytest.mark.e2e
MODEL = "smol-endpoint"
CHAT = "/v1/chat/completions"
KEY_ENV = "E2E_FLEET_KEY"
# Admission quick to react in a test: a floor of 1 (a storm visibly drives it there), short retry waits.
ADMISSION_ENV = {"NIGHTBATCH_ENDPOINT_MIN_CONCURRENCY": "1", "NIGHTBATCH_ENDPOINT_INITIAL_CONCURRENCY": "8",
                 "NIGHTBATCH_ENDPOINT_MAX_CONCURRENCY": "16", "NIGHTBATCH_ENDPOINT_RETRY_SECONDS": "0.2",
                 "NIGHTBATCH_ENDPOINT_RETRY_MAX_SECONDS": "2", "NIGHTBATCH_ENDPOINT_METRICS_SECONDS": "1"}


def endpoint_model(name: str, proxy: EndpointProxy) -> dict[str, Any]:
    return {"name": name, "max_model_len": 2048,
            "endpoint": {"url": proxy.v1, "model": SERVED_NAME, "api_key_env": KEY_ENV}}


@pytest.fixture(scope="module")
def proxy(vllm_server: VllmServer) -> Iterator[EndpointProxy]:
    with running_proxy(vllm_server.url) as p:
        yield p


@pytest.fixture(scope="module")
def endpoint_stack(proxy: EndpointProxy, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """`nightbatch local` whose one model is on the endpoint: it starts no engine of its own."""
    env = {**os.environ, "NIGHTBATCH_API_KEY": API_KEY, KEY_ENV: FLEET_KEY,
           "NIGHTBATCH_MODELS_JSON": json.dumps([endpoint_model(MODEL, proxy)]),
           "NIGHTBATCH_WORKER_POLL_SECONDS": "1", "NIGHTBATCH_CHECKPOINT_EVERY_SECONDS": "1",
           "NIGHTBATCH_WORKER_DRAIN_SECONDS": "5", "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
           "XDG_STATE_HOME": str(tmp_path_factory.mktemp("endpoint-state")), **ADMISSION_ENV}
    env.pop("AWS_ENDPOINT_URL", None)
    log = tmp_path_factory.mktemp("endpoint-local") / "nightbatch-local.log"
    with running_local(env, log, stop_timeout=60) as stack:
        yield stack


def chat(i: int, prefix: str, max_tokens: int = 16) -> dict[str, Any]:
    return {"custom_id": f"{prefix}-{i}", "method": "POST", "url": CHAT,
            "body": {"model": MODEL, "messages": [{"role": "user", "content": f"{prefix}: count to three ({i})"}],
                     "max_tokens": max_tokens, "temperature": 0}}


def results(client: OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    return [] if file_id is None else [json.loads(x) for x in client.files.content(file_id).text.splitlines()]


def each_line_once(client: OpenAI, batch_id: str, n: int, prefix: str) -> tuple[list[Any], list[Any]]:
    batch = client.batches.retrieve(batch_id)
    ok, bad = results(client, batch.output_file_id), results(client, batch.error_file_id)
    ids = [r["custom_id"] for r in ok + bad]
    assert len(ids) == len(set(ids)) == n and set(ids) == {f"{prefix}-{i}" for i in range(n)}
    return ok, bad


def admission_log(stack: LocalStack) -> dict[str, float]:
    """The endpoint's admission as the stack last logged it (at the end of a shard)."""
    found = re.findall(r"concurrency ([\d.]+) \(lowest ([\d.]+), highest ([\d.]+)\), (\d+) decreases, "
                       r"(\d+) overload answers", stack.log.read_text(errors="replace"))
    assert found, "the stack logged no endpoint admission line"
    limit, lowest, highest, decreases, overloads = found[-1]
    return {"limit": float(limit), "lowest": float(lowest), "highest": float(highest),
            "decreases": float(decreases), "overloads": float(overloads)}


def test_every_line_once_with_the_servers_answers(endpoint_stack: LocalStack, proxy: EndpointProxy) -> None:
    client = endpoint_stack.client()
    n = 30
    batch = submit(client, [chat(i, "once") for i in range(n)], CHAT)
    done = wait(client, batch.id)
    assert done.status == "completed"
    ok, bad = each_line_once(client, batch.id, n, "once")
    assert bad == [] and len(ok) == n
    for line in ok:
        body = line["response"]["body"]
        assert line["response"]["status_code"] == 200 and body["object"] == "chat.completion"
        assert body["model"] == MODEL  # nightbatch's name, though the server serves it as SERVED_NAME
        assert body["usage"]["completion_tokens"] > 0 and body["system_fingerprint"].startswith("vllm-")
    sent = [p for p in proxy.snapshot() if p.prompt.startswith("once:")]
    assert sorted(p.prompt for p in sent if p.status == 200) == sorted(f"once: count to three ({i})"
                                                                       for i in range(n))
    assert done.usage is not None and done.usage.output_tokens > 0


def test_anthropic_message_batches_run_on_the_endpoint_too(endpoint_stack: LocalStack) -> None:
    """The Anthropic SDK's Message Batches on the same endpoint model: vLLM's own /v1/messages answers them."""
    client = anthropic.Anthropic(base_url=endpoint_stack.base_url.removesuffix("/v1"), api_key=endpoint_stack.api_key,
                                 max_retries=0)
    requests = [{"custom_id": f"msg-{i}", "params": {"model": MODEL, "max_tokens": 8, "temperature": 0,
                                                     "messages": [{"role": "user", "content": f"Say hello {i}."}]}}
                for i in range(3)]
    created = client.messages.batches.create(requests=requests)  # type: ignore[arg-type]
    deadline = time.monotonic() + 600
    while client.messages.batches.retrieve(created.id).processing_status != "ended":
        assert time.monotonic() < deadline, "the message batch did not end"
        time.sleep(1)
    rows = {r.custom_id: r.result for r in client.messages.batches.results(created.id)}
    assert set(rows) == {"msg-0", "msg-1", "msg-2"}
    for result in rows.values():
        assert result.type == "succeeded", result
        assert result.message.model == MODEL and result.message.content[0].type == "text"
        assert result.message.usage.output_tokens > 0


def test_cancel_mid_run_ends_every_line_once(endpoint_stack: LocalStack) -> None:
    client = endpoint_stack.client()
    n = 300  # about a minute of the CPU server's time: the cancel lands mid-run
    batch = submit(client, [chat(i, "cancel", max_tokens=64) for i in range(n)], CHAT)
    wait_for_a_result(client, batch.id)
    client.batches.cancel(batch.id)
    done = wait(client, batch.id)
    assert done.status == "cancelled"
    ok, bad = each_line_once(client, batch.id, n, "cancel")
    assert ok and bad and {r["error"]["code"] for r in bad} == {"batch_cancelled"}
    assert all(r["response"]["status_code"] == 200 for r in ok)


def test_a_429_storm_shrinks_concurrency_to_the_floor_and_it_recovers(endpoint_stack: LocalStack,
                                                                      proxy: EndpointProxy) -> None:
    client = endpoint_stack.client()
    n, storm = 100, 30
    proxy.start_storm(after=15, count=storm)  # after 15 POSTs pass, the next 30 are shed with 429
    batch = submit(client, [chat(i, "storm") for i in range(n)], CHAT)
    done = wait(client, batch.id)
    assert done.status == "completed"
    ok, bad = each_line_once(client, batch.id, n, "storm")
    assert bad == [] and all(r["response"]["status_code"] == 200 for r in ok)  # a 429 is never a result
    passed = sorted((p for p in proxy.snapshot() if p.prompt.startswith("storm:")), key=lambda p: p.arrived)
    shed = [p for p in passed if p.status == 429]
    assert len(shed) == storm
    after = [p for p in passed if p.status == 200 and p.arrived > shed[-1].arrived]
    before = [p for p in passed if p.status == 200 and p.arrived < shed[0].arrived]
    assert max(p.in_flight for p in before) >= 4  # it had several requests in flight before the storm
    admission = admission_log(endpoint_stack)
    assert admission["lowest"] == 1 and admission["overloads"] >= storm  # the storm drove it to the floor
    assert max(p.in_flight for p in after) >= 4 and admission["limit"] >= 4  # and it grew back after


def test_a_runner_killed_mid_shard_resumes_without_redoing_checkpointed_lines(
        fresh_aws: Callable[..., Adapters], proxy: EndpointProxy, tmp_path: Path) -> None:
    adapters = fresh_aws(**WORKER_OVERRIDES)
    world = ShardWorld(settings=adapters.settings, adapters=adapters, batch_id=new_batch_id())
    world.put_batch()
    n = 120
    ids = world.seed([{"custom_id": f"resume-{i:03d}", "body": {
        "model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": f"resume: count to three ({i})"}],
        "max_tokens": 32, "temperature": 0}} for i in range(n)])
    env = worker_env(world, NIGHTBATCH_BACKEND="endpoint", **{KEY_ENV: FLEET_KEY}, **ADMISSION_ENV,
                     NIGHTBATCH_MODELS_JSON=json.dumps([endpoint_model("SmolLM2-135M-Instruct", proxy)]))
    first = spawn(env, tmp_path / "first.log", argv=[sys.executable, "-m", "gpu_worker"])
    assert wait_until(checkpoints_reach(world, 2), first, timeout=600), first.stderr()
    assert first.kill(), "the runner finished before it could be killed: make the shard longer"
    killed_at = time.monotonic()
    checkpointed, _ = world.results()
    assert 0 < len(checkpointed) < n
    second = spawn(env, tmp_path / "second.log", argv=[sys.executable, "-m", "gpu_worker"])
    assert second.wait(timeout=900) == 0, second.stderr()
    got, duplicates = world.results()
    assert duplicates == 0 and sorted(got) == ids
    assert (world.done_marker() or {}).get("attempts") == 2
    resent = {p.prompt for p in proxy.snapshot() if p.arrived > killed_at and p.prompt.startswith("resume:")}
    done_before = {f"resume: count to three ({int(c.split('-')[1])})" for c in checkpointed}
    assert resent and not resent & done_before  # no checkpointed line went to the server again


def test_the_server_stopped_mid_batch_loses_no_line_and_the_batch_ends(
        endpoint_stack: LocalStack, proxy: EndpointProxy, vllm_server: VllmServer) -> None:
    client = endpoint_stack.client()
    n = 80
    batch = submit(client, [chat(i, "outage", max_tokens=32) for i in range(n)], CHAT)
    wait_for_a_result(client, batch.id)
    failed_before = proxy.count(502)
    vllm_server.stop()
    deadline = time.monotonic() + 300
    while proxy.count(502) < failed_before + 5 and time.monotonic() < deadline:  # lines being retried
        time.sleep(0.5)
    assert proxy.count(502) >= failed_before + 5
    assert client.batches.retrieve(batch.id).status == "in_progress"
    vllm_server.start()
    done = wait(client, batch.id, timeout=900)
    assert done.status == "completed"
    ok, bad = each_line_once(client, batch.id, n, "outage")
    assert bad == [] and len(ok) == n  # a 502 or a refused connection is never a line's result
