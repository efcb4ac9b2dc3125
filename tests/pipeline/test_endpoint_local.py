"""The local stack runs a model with an `endpoint` on its server (a real HTTP server scripted by the test), with no
engine of its own: every line once, the server's answers as the results, the attempts recorded on the endpoint."""

from __future__ import annotations

import json

import pytest

from nightbatch import layout
from nightbatch.batches.accounting import read_attempts
from nightbatch.local.runner import LocalWorkflow
from nightbatch.wiring import Services
from tests.support.endpoints import fresh_endpoints  # noqa: F401  (the fixture)
from tests.support.pipeline_world import chat_line, jsonl, make_batch
from tests.support.scripted_server import Answer, Seen, chat_completion, scripted_server

MODEL = "llama-8b"


pytestmark = pytest.mark.usefixtures("fresh_endpoints")


def answer(request: Seen) -> Answer:
    body = request.body or {}
    if request.path == "/metrics":
        return Answer(404, {})
    return Answer(200, chat_completion(body, content="served: " + body["messages"][0]["content"]))


def test_a_model_on_an_endpoint_runs_there_and_starts_no_engine(services: Services,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLAMA_KEY", "sk-local")
    with scripted_server(answer) as server:
        services.settings.serving.models_json = json.dumps([{"name": MODEL, "endpoint": {
            "url": server.v1, "model": "meta-llama/Llama-3.1-8B-Instruct", "api_key_env": "LLAMA_KEY"}}])
        services.settings.pipeline.shard_target_tokens = 40  # a few shards
        workflow = LocalWorkflow(services.adapters)
        workflow.bind(services)
        try:
            batch_id = make_batch(services, jsonl([chat_line(i, model=MODEL) for i in range(9)]))
            workflow.run(batch_id)
            assert workflow.host is not None and workflow.host.engines == {}  # no vLLM started
        finally:
            workflow.stop()
    batch = services.batches.get("default", batch_id)
    assert batch.status == "completed" and batch.request_counts.model_dump() == {"total": 9, "completed": 9,
                                                                                 "failed": 0}
    out = b"".join(services.files.chunks(services.files.item("default", batch.output_file_id or "")))
    lines = [json.loads(x) for x in out.splitlines()]
    assert sorted(line["custom_id"] for line in lines) == sorted(f"req-{i}" for i in range(9))
    for line in lines:
        body = line["response"]["body"]
        assert body["model"] == MODEL
        assert body["choices"][0]["message"]["content"] == f"served: question {line['custom_id'][4:]}"
    posts = [s for s in server.seen if s.method == "POST"]
    assert len(posts) == 9 and {s.headers["authorization"] for s in posts} == {"Bearer sk-local"}
    assert {s.body["model"] for s in posts if s.body} == {"meta-llama/Llama-3.1-8B-Instruct"}
    assert all(int(s.headers["x-slo-ttft-ms"]) > 0 for s in posts)
    attempts = list(read_attempts(services.adapters.blobs, [layout.all_results_prefix(batch_id)]))
    assert attempts and {a.backend for a in attempts} == {"endpoint"}
    assert sum(a.lines for a in attempts) == 9 and sum(a.input_tokens for a in attempts) == 27
