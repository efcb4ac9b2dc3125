"""`nightbatch doctor` against the API over real HTTP (moto behind it, the workflow only recorded, so batches
stay `validating`): the key check, the models with their endpoints, one probe per model and endpoint, and the
stall report with its remedy. The full run through real engines is tests/e2e/test_doctor.py."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any

import pytest

from nightbatch.cli.doctor.api import _model_loaded, probe_pairs
from nightbatch.cli.doctor.report import Check, Phase, Probe, Report
from nightbatch.cli.doctor.run import Doctor
from nightbatch.cli.doctor.webhook import WebhookWatcher
from nightbatch.cli.main import main
from nightbatch.models.spec import ENDPOINTS, LOCAL_MODELS
from tests.conftest import ApiServer

CHAT = LOCAL_MODELS[0]


def doctor(api_server: ApiServer, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str]:
    code = main(["doctor", "--base-url", api_server.base_url, "--api-key", api_server.api_key,
                 "--timeout", "1.5", "--stall-after", "0.5", "--poll-interval", "0.2", *extra])
    out, err = capsys.readouterr()
    return code, out, err


def test_models_say_which_endpoints_they_serve(api_server: ApiServer) -> None:
    models = {m.id: (m.model_extra or {})["nightbatch"] for m in api_server.openai().models.list()}
    assert models["SmolLM2-135M-Instruct"] == {"task": "generate", "endpoints": list(CHAT.endpoints)}
    assert "/v1/chat/completions" in CHAT.endpoints and "/v1/completions" in CHAT.endpoints
    embed = ["/v1/embeddings", "/v1/score", "/v1/rerank"]  # vLLM scores with an embedding model too
    assert models["all-MiniLM-L6-v2"] == {"task": "embed", "endpoints": embed}
    one = api_server.openai().models.retrieve("all-MiniLM-L6-v2")
    assert (one.model_extra or {})["nightbatch"]["endpoints"] == embed


def test_a_stuck_batch_is_reported_with_its_phase_and_remedy(api_server: ApiServer,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = doctor(api_server, capsys)
    assert code == 1
    assert "✓ API key" in out and "a wrong key is refused" in out
    chat = ", ".join(e.removeprefix("/v1/") for e in CHAT.endpoints)
    assert f"SmolLM2-135M-Instruct ({chat}), all-MiniLM-L6-v2 (embeddings, score, rerank)" in out
    pairs = [(m.name, e) for m in LOCAL_MODELS for e in m.endpoints]
    for model, endpoint in pairs:  # one probe per model and endpoint
        assert f"{model} {endpoint}  batch_" in out
    assert out.count("✗ validate") == len(pairs) and "gave up after 1.5 s" in out
    assert "the workflow has not run Validate" in out
    assert "validate stalled" in err  # said while waiting, not only at the end
    assert api_server.workflow.started  # the probes are real batches
    # Each probe is a one-line file for its own endpoint, with a small max_tokens.
    client = api_server.openai()
    for batch in client.batches.list():
        line = json.loads(client.files.content(batch.input_file_id).text)
        assert line["url"] == batch.endpoint
        assert line["body"].get("max_tokens", 8) <= 8 and batch.metadata == {"nightbatch_doctor": "1"}


def test_json_report(api_server: ApiServer, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = doctor(api_server, capsys, "--json")
    report = json.loads(out)
    assert code == 1 and report["passed"] is False
    assert [c["name"] for c in report["checks"]] == ["API key", "models", "webhook"]
    # This server refuses loopback webhook URLs (as in AWS): no temporary endpoint, the phase cannot be watched.
    assert report["checks"][2]["status"] == "skipped"
    phases = report["probes"][0]["phases"]
    assert [p["name"] for p in phases][:2] == ["validate", "job queued"]
    assert phases[0]["status"] == "stalled" and phases[0]["remedy"]


def test_a_wrong_key_stops_at_the_key_check(api_server: ApiServer, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["doctor", "--base-url", api_server.v1, "--api-key", "sk-wrong"])
    out, _ = capsys.readouterr()
    assert code == 1
    assert "✗ API key" in out and "refused (HTTP 401)" in out and "ApiKeysSecret" in out
    assert not list(api_server.openai().batches.list())


def test_a_server_that_does_not_list_endpoints_gets_every_endpoint_tried() -> None:
    """Older servers answer /v1/models without `nightbatch.endpoints`: every endpoint is tried (uncertain), and a
    probe refused at validation as model_not_found is then dropped (Doctor.run)."""
    pairs = probe_pairs([("old-model", None), ("SmolLM2-135M-Instruct", ("/v1/completions",))])
    assert pairs == [*(("old-model", e, False) for e in ENDPOINTS), ("SmolLM2-135M-Instruct", "/v1/completions", True)]



def test_on_loopback_a_temporary_webhook_endpoint_watches_the_probes(serve_api: Callable[..., ApiServer],
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    api_server = serve_api(allow_private_targets=True)  # what `nightbatch local` sets
    seen: list[str] = []
    original = WebhookWatcher.close

    def close(self: WebhookWatcher) -> None:
        seen.extend(e["id"] for e in api_server.openai().get("/webhook_endpoints", cast_to=dict[str, Any])["data"])
        original(self)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(WebhookWatcher, "close", close)
        _, out, _ = doctor(api_server, capsys)
    assert "✓ webhook" in out and "removed afterwards" in out
    assert len(seen) == 1  # subscribed while the probes ran ...
    assert api_server.openai().get("/webhook_endpoints", cast_to=dict[str, Any])["data"] == []  # ... then removed


class ExplainingWatcher:
    """Stands in for the AWS side in a test of the doctor's own loop: it knows why validate is stuck."""

    def preflight(self, report: Report) -> None:
        report.add(Check("stack", "ok", "test"))

    def observe(self, probe: Probe, at: float) -> None:
        return None

    def diagnose(self, probe: Probe, phase: Phase) -> tuple[str, str] | None:
        return ("the execution is RUNNING, last state Validate", "open the execution") if phase.name == "validate" \
            else None

    def close(self) -> None:
        return None


def test_a_watchers_diagnosis_replaces_the_generic_remedy(api_server: ApiServer) -> None:
    progress = io.StringIO()
    report = Report(base_url=api_server.v1)
    Doctor(api_server.openai(), report, [ExplainingWatcher()], timeout=1.2, stall_after=0.3, poll=0.1,
           progress=progress).run()
    validate = report.probes[0].phase("validate")
    assert validate.status == "stalled" and validate.remedy == "open the execution"
    assert validate.detail == "the execution is RUNNING, last state Validate (gave up after 1.2 s)"
    assert "validate stalled: the execution is RUNNING" in progress.getvalue()
    assert not report.passed and [c.name for c in report.checks] == ["API key", "models", "stack"]


def test_model_loaded_comes_from_the_workers_phase_clock() -> None:
    """`batch.nightbatch.phases` (the worker's container start and its seconds to weights and engine) places the
    phase on the doctor's timeline; older servers only have the load seconds in `nightbatch.cost`."""
    probe = Probe(model="m", endpoint="/v1/completions", batch_id="batch_x", created_at=1_000.0)
    attempts = [{"shard_id": "s1", "container_start": 1_020.0, "weights_source": "s3-cache",
                 "weights_ready_s": 9.5, "engine_ready_s": 41.25, "first_result_s": 43.0},
                {"shard_id": "s0", "container_start": 1_012.0, "weights_source": "hf",
                 "weights_ready_s": 30.0, "engine_ready_s": 70.0}]
    _model_loaded(probe, {"phases": {"attempts": 2, "shards": attempts}})
    loaded = probe.phase("model loaded")
    assert (loaded.status, loaded.at) == ("ok", 82.0)  # the first container: 12 s + 70 s
    probe.reach("first result", 85.0)
    assert (loaded.took, probe.phase("first result").took) == (82.0, 3.0)  # each from the phase before
    assert loaded.detail == "engine ready 70.0 s after the shard started (weights 30.0 s, from hf)"

    older = Probe(model="m", endpoint="/v1/completions")
    _model_loaded(older, {"cost": {"model_load_seconds": 12.5}})
    assert older.phase("model loaded").at is None and "12.5 s loading the model" in older.phase("model loaded").detail
    unknown = Probe(model="m", endpoint="/v1/completions")
    _model_loaded(unknown, {})
    assert unknown.phase("model loaded").status == "skipped"
