"""The endpoint engine (gpu_worker/engines/endpoint_engine.py) against a real HTTP server scripted by the test: what it
sends, which answers are a line's result and which are retried, and the shard runner on it (every line once)."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from gpu_worker.engines import endpoint_engine
from gpu_worker.engines.base import EngineFailedError
from gpu_worker.engines.endpoint_engine import EndpointEngine, EndpointRefusedError, retry_after_seconds
from gpu_worker.main import main
from gpu_worker.runner import ShardJob, run_shard
from gpu_worker.saturation import parse_load
from nightbatch.batches.accounting import read_attempts
from nightbatch.models.spec import ModelSpec
from nightbatch.settings import AdmissionSettings, get_settings
from tests.support.endpoints import fresh_endpoints  # noqa: F401  (the fixture)
from tests.support.scripted_server import Answer, Seen, chat_completion, scripted_server

from .conftest import ShardWorld, chat_requests

SERVED = "org/Served-Model-Name"
CHAT = "/v1/chat/completions"
FAST = AdmissionSettings(retry_seconds=0.01, retry_max_seconds=0.05, metrics_seconds=0)


pytestmark = pytest.mark.usefixtures("fresh_endpoints")  # each test's server is a new endpoint


def spec_for(url: str, **endpoint: Any) -> ModelSpec:
    return ModelSpec.model_validate({"name": "SmolLM2-135M-Instruct",
                                     "endpoint": {"url": url, "model": SERVED, **endpoint}})


def run(engine: EndpointEngine, coro: Callable[[], Any]) -> Any:
    async def scenario() -> Any:
        await engine.start()
        try:
            return await coro()
        finally:
            await engine.stop()

    return asyncio.run(scenario())


def chat(i: int = 0) -> dict[str, Any]:
    return {"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": f"q{i}"}], "max_tokens": 4}


def sequence(*answers: Answer) -> Callable[[Seen], Answer]:
    """The answers in order, then 200s."""
    it = iter(answers)
    lock = threading.Lock()

    def answer(request: Seen) -> Answer:
        with lock:
            nxt = next(it, None)
        return nxt if nxt is not None else Answer(200, chat_completion(request.body or {}))

    return answer


def test_sends_the_body_to_the_server_by_its_model_name_with_priority_deadline_and_headers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_ENDPOINT_KEY", "sk-endpoint")
    with scripted_server(sequence()) as server:
        spec = spec_for(server.v1, api_key_env="TEST_ENDPOINT_KEY", priority=77,
                        headers={"x-gateway-inference-objective": "batch-sheddable"})
        assert spec.endpoint is not None
        key = endpoint_engine.resolve_api_key(spec.endpoint, lambda: None)
        engine = EndpointEngine(spec, settings=FAST, api_key=key, deadline=time.time() + 3600)
        reply = run(engine, lambda: engine.handle(CHAT, chat(), "req_abc"))
    assert reply.status_code == 200
    assert reply.body["model"] == "SmolLM2-135M-Instruct"  # the name the line used, as the local engine answers
    (request,) = server.seen
    assert request.path == "/v1/chat/completions"
    assert request.body == {**chat(), "model": SERVED, "priority": 77}
    assert request.headers["authorization"] == "Bearer sk-endpoint"
    assert request.headers["x-gateway-inference-objective"] == "batch-sheddable"
    assert request.headers["x-vllm-priority"] == "77"
    assert request.headers["x-request-id"] == "req_abc"
    assert 0 < int(request.headers["x-slo-ttft-ms"]) <= 3600 * 1000


def test_no_priority_when_the_endpoint_says_null_and_none_on_anthropic_messages() -> None:
    with scripted_server(sequence()) as server:
        engine = EndpointEngine(spec_for(server.v1, priority=None), settings=FAST)
        run(engine, lambda: engine.handle(CHAT, chat(), "r1"))
        engine = EndpointEngine(spec_for(server.v1), settings=FAST)
        run(engine, lambda: engine.handle("/v1/messages", {"model": "SmolLM2-135M-Instruct", "max_tokens": 4,
                                                           "messages": []}, "r2"))
    first, second = server.seen
    assert "priority" not in (first.body or {}) and "x-vllm-priority" not in first.headers
    assert second.path == "/v1/messages" and "priority" not in (second.body or {})
    assert second.headers["x-vllm-priority"] == str(1_000_000)


def test_a_lines_own_4xx_is_its_result_and_a_json_500_is_after_its_retries() -> None:
    error = {"error": {"message": "This model's maximum context length is 2048 tokens.", "type": "BadRequestError",
                       "param": None, "code": 400}}
    internal = {"error": {"message": "boom", "type": "InternalServerError", "param": None, "code": 500}}
    settings = FAST.model_copy(update={"server_error_retries": 2})
    answers = [Answer(400, error), Answer(404, b"<html>no</html>"), *[Answer(500, internal)] * 3,
               Answer(500, internal)]  # the fourth line's first 500 is a stopping server's: its retry succeeds
    with scripted_server(sequence(*answers)) as s:
        engine = EndpointEngine(spec_for(s.v1), settings=settings)

        async def four() -> list[Any]:
            return [await engine.handle(CHAT, chat(i), f"r{i}") for i in range(4)]

        bad, missing, failed, recovered = run(engine, four)
    assert (bad.status_code, bad.body) == (400, error)
    assert missing.status_code == 404 and "<html>no</html>" in missing.body["error"]["message"]
    assert (failed.status_code, failed.body) == (500, internal)  # after 2 retries: the line's own result
    assert recovered.status_code == 200
    assert len(s.seen) == 7 and engine.retries == 3


def test_429_503_gateway_errors_dropped_connections_and_timeouts_are_retried_never_a_result() -> None:
    answers = sequence(
        Answer(429, {"error": {"message": "slow down"}}, headers={"retry-after": "0"}),
        Answer(503, {"error": {"message": "overloaded"}}),
        Answer(502, b"<html>bad gateway</html>", headers={"content-type": "text/html"}),
        Answer(500, b"upstream connect error"),
        Answer(drop=True),
        Answer(delay=2.0),  # past the engine's timeout
    )
    with scripted_server(answers) as server:
        engine = EndpointEngine(spec_for(server.v1), settings=FAST.model_copy(update={"timeout_seconds": 0.5}))
        reply = run(engine, lambda: engine.handle(CHAT, chat(), "r"))
        assert reply.status_code == 200 and reply.body["choices"][0]["message"]["content"] == "ok"
        assert engine.retries == 6 and len(server.seen) == 7
        assert engine.admission.stats.overloads == 6 and engine.admission.limit < 8


def test_retry_after_holds_the_endpoint_for_the_time_it_names() -> None:
    assert retry_after_seconds("3") == 3.0
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
    assert retry_after_seconds("soon") is None and retry_after_seconds(None) is None
    with scripted_server(sequence(Answer(429, {}, headers={"retry-after": "1"}))) as server:
        engine = EndpointEngine(spec_for(server.v1), settings=FAST)

        async def go() -> float:
            first = asyncio.create_task(engine.handle(CHAT, chat(), "r"))
            while not server.seen:
                await asyncio.sleep(0.01)
            while engine.admission.held_for == 0 and not first.done():
                await asyncio.sleep(0.01)
            held = engine.admission.held_for
            await first
            return held

        held = run(engine, go)
    assert 0 < held <= 1.0 and len(server.seen) == 2


def test_refused_credentials_fail_the_engine_rather_than_every_line() -> None:
    with scripted_server(sequence(Answer(401, {"error": {"message": "bad key"}}))) as server:
        engine = EndpointEngine(spec_for(server.v1), settings=FAST)
        with pytest.raises(EndpointRefusedError, match="401"):
            run(engine, lambda: engine.handle(CHAT, chat(), "r"))
    assert issubclass(EndpointRefusedError, EngineFailedError)


def test_a_2xx_that_is_not_a_json_object_is_the_lines_error_not_a_crash() -> None:
    with scripted_server(sequence(Answer(200, b"[1, 2]"))) as server:
        engine = EndpointEngine(spec_for(server.v1), settings=FAST)
        reply = run(engine, lambda: engine.handle(CHAT, chat(), "r"))
    assert reply.status_code == 502 and "not a JSON object" in reply.body["error"]["message"]


def test_handle_before_start_is_an_engine_failure() -> None:
    engine = EndpointEngine(spec_for("http://127.0.0.1:9/v1"), settings=FAST)
    with pytest.raises(EngineFailedError):
        asyncio.run(engine.handle(CHAT, chat(), "r"))


VLLM_METRICS = """# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
vllm:num_requests_waiting{engine="1",model_name="m"} 4.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5
vllm:num_requests_running{engine="0",model_name="m"} 9.0
"""


def test_load_is_read_from_vllm_metrics_summed_over_engines() -> None:
    load = parse_load(VLLM_METRICS)
    assert (load.waiting, load.kv_cache) == (7.0, 0.5)
    assert load.saturated(AdmissionSettings(max_waiting=5)) and not load.saturated(AdmissionSettings(max_waiting=8))
    assert parse_load("vllm:gpu_cache_usage_perc 0.9\n").saturated(AdmissionSettings())
    assert not parse_load("other_metric 1\n").known


def test_a_saturated_server_shrinks_the_concurrency_without_any_error() -> None:
    def answer(request: Seen) -> Answer:
        if request.path == "/metrics":
            return Answer(200, VLLM_METRICS.encode(), headers={"content-type": "text/plain"})
        return Answer(200, chat_completion(request.body or {}))

    with scripted_server(answer) as server:
        engine = EndpointEngine(spec_for(server.v1), settings=FAST.model_copy(update={"metrics_seconds": 0.05}))

        async def go() -> None:
            while engine.admission.stats.saturated_reads < 3:
                await asyncio.sleep(0.02)

        run(engine, go)
    assert engine.admission.limit == 2 and engine.admission.saturated
    assert any(s.path == "/metrics" for s in server.seen)


def test_the_shard_runner_on_an_endpoint_that_throttles_gets_every_line_once(world: ShardWorld) -> None:
    counter = itertools.count()
    lock = threading.Lock()

    def answer(request: Seen) -> Answer:
        with lock:
            n = next(counter)
        if n % 3 == 1:  # a third of the sends are refused for load
            return Answer(429, {"error": {"message": "rate limited"}}, headers={"retry-after": "0"})
        body = request.body or {}
        text = body["messages"][0]["content"]
        if text == "question 7":
            return Answer(400, {"error": {"message": "bad line", "type": "BadRequestError", "code": 400}})
        return Answer(200, chat_completion(body, content=f"answer to {text}"))

    ids = world.seed(chat_requests(40))
    with scripted_server(answer) as server:
        engine = EndpointEngine(spec_for(server.v1), settings=FAST)

        async def go() -> Any:
            return await run_shard(ShardJob(batch_id=world.batch_id, shard_id=world.shard_id), engine=engine,
                                   blobs=world.adapters.blobs, table=world.adapters.table, settings=world.settings)

        report = run(engine, go)
    assert report.finished and report.completed == 39 and report.failed == 1
    results, duplicates = world.results()
    assert duplicates == 0 and sorted(results) == sorted(ids)
    for custom_id, line in results.items():
        status = line["response"]["status_code"]
        assert status in (200, 400), line  # a 429 is never a result
        if status == 200:
            i = int(custom_id.split("-")[1])
            assert line["response"]["body"]["choices"][0]["message"]["content"] == f"answer to question {i}"
    assert engine.retries > 0


def test_the_worker_entry_runs_an_endpoint_job_there_with_the_key_from_its_secret(
        env: ShardWorld, monkeypatch: pytest.MonkeyPatch) -> None:
    """`python -m gpu_worker` in a job that says NIGHTBATCH_BACKEND=endpoint: no engine of its own, the API key read
    from Secrets Manager, the attempt recorded on the endpoint."""
    env.adapters.client("secretsmanager").create_secret(Name="nightbatch/llama-key", SecretString="sk-from-secret")
    ids = env.seed(chat_requests(5))
    with scripted_server(sequence()) as server:
        monkeypatch.setenv("NIGHTBATCH_MODELS_JSON", json.dumps([{"name": "SmolLM2-135M-Instruct", "endpoint": {
            "url": server.v1, "api_key_secret": "nightbatch/llama-key", "metrics_url": ""}}]))
        monkeypatch.setenv("NIGHTBATCH_BACKEND", "endpoint")
        get_settings.cache_clear()
        assert main([]) == 0
    results, duplicates = env.results()
    assert duplicates == 0 and sorted(results) == ids and env.done_marker() is not None
    assert len(server.seen) == 5 and {s.headers["authorization"] for s in server.seen} == {"Bearer sk-from-secret"}
    (attempt,) = read_attempts(env.adapters.blobs, [env.prefix])
    assert attempt.backend == "endpoint" and attempt.lines == 5 and attempt.model_load_seconds < 60


def test_stop_sending_aborts_the_requests_not_sent_and_lets_the_sent_ones_finish() -> None:
    """A stopping shard (cancel, expiry, a move to the GPUs) must not feed the server the lines still waiting for a
    slot or for a retry: they end aborted at once, and their lines stay unrun."""
    with scripted_server(lambda request: Answer(200, chat_completion(request.body or {}), delay=0.5)) as server:
        engine = EndpointEngine(spec_for(server.v1), settings=AdmissionSettings(
            floor=1, initial=1, ceiling=1, metrics_seconds=0))

        async def go() -> list[Any]:
            tasks = [asyncio.create_task(engine.handle(CHAT, chat(i), f"r{i}")) for i in range(6)]
            while not server.seen:
                await asyncio.sleep(0.01)
            engine.stop_sending()
            return await asyncio.gather(*tasks, return_exceptions=True)

        outcomes = run(engine, go)
    finished = [o for o in outcomes if not isinstance(o, BaseException)]
    aborted = [o for o in outcomes if isinstance(o, asyncio.CancelledError)]
    assert len(finished) == 1 and finished[0].status_code == 200 and len(aborted) == 5
    assert len(server.seen) == 1  # only the request already sent reached the server
