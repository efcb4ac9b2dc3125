"""The dashboard's browser fixtures: Debian's chromium driven by Playwright, a seeded API, shared helpers."""

from __future__ import annotations

import io
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from nightbatch import layout
from nightbatch.aws.records import DeliveryRecord, EventRecord, WebhookEndpointRecord
from nightbatch.batches.request import CreateBatchRequest
from nightbatch.clock import now, sort_key
from nightbatch.notifications.delivery import delivery_id
from nightbatch.notifications.events import event_pk
from nightbatch.wiring import Services
from tests.support.lifecycle import drive

if TYPE_CHECKING:
    from tests.conftest import ApiServer

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-quic", "--no-first-run", "--disable-component-update", "--disable-sync"]
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "artifacts"
MODEL = "SmolLM2-135M-Instruct"

BROWSER = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="no chromium: run scripts/ensure-chromium.sh"),
]


def request_line(i: int) -> bytes:
    body = {"model": MODEL, "messages": [{"role": "user", "content": f"Question {i}"}], "max_tokens": 16}
    return json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions",
                       "body": body}).encode() + b"\n"


def output_line(batch_id: str, i: int) -> bytes:
    body = {"id": f"chatcmpl-{i}", "object": "chat.completion", "model": MODEL,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": f"Answer {i}"},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}}
    return json.dumps({"id": f"batch_req_{i}", "custom_id": f"req-{i}",
                       "response": {"status_code": 200, "request_id": f"req_{i}", "body": body},
                       "error": None}).encode() + b"\n"


def put_file(services: Services, file_id: str, data: bytes, filename: str) -> None:
    services.adapters.blobs.put_bytes(f"files/{file_id}", data)
    services.files.register("default", file_id=file_id, key=f"files/{file_id}", size=len(data),
                            filename=filename, purpose="batch_output")


def create_batch(services: Services, lines: int, **metadata: str) -> str:
    data = b"".join(request_line(i) for i in range(lines))
    f = services.files.create("default", filename="requests.jsonl", purpose="batch", fileobj=io.BytesIO(data),
                              size=len(data))
    req = CreateBatchRequest(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h",
                             metadata=metadata or None)
    return services.batches.create("default", req).id


def backdate(services: Services, batch_id: str, created_ago: int, **stamps_ago: int) -> None:
    """Spreads the seeded batches over the last hours, as a real list would be (and fixes their order)."""
    t = now()
    fields: dict[str, Any] = {"created_at": t - created_ago, "owner_sk": sort_key(t - created_ago, batch_id),
                              "expires_at": t - created_ago + 24 * 3600}
    fields.update({name: t - ago for name, ago in stamps_ago.items()})
    services.adapters.table.update(batch_id, set_=fields)


@pytest.fixture
def seeded(api_server: ApiServer) -> dict[str, Any]:
    """Four batches a person would recognise: done with files, failed validation, running, just created."""
    services: Services = api_server.services
    done = create_batch(services, 4, job="nightly-eval")
    output = b"".join(output_line(done, i) for i in range(3))
    errors = json.dumps({"id": "batch_req_3", "custom_id": "req-3", "response": {
        "status_code": 400, "request_id": "req_3", "body": {"error": {
            "message": "This model's maximum context length is 2048 tokens.",
            "type": "invalid_request_error"}}},
        "error": None}).encode() + b"\n"
    put_file(services, "file-dashboardOutput000000", output, f"{done}_output.jsonl")
    put_file(services, "file-dashboardErrors000000", errors, f"{done}_error.jsonl")
    drive(services, done, "in_progress", request_counts={"total": 4, "completed": 0, "failed": 0}, model=MODEL)
    drive(services, done, "finalizing", "completed", output_file_id="file-dashboardOutput000000",
          error_file_id="file-dashboardErrors000000",
          request_counts={"total": 4, "completed": 3, "failed": 1},
          usage={"input_tokens": 36, "input_tokens_details": {"cached_tokens": 0},
                 "output_tokens": 15, "output_tokens_details": {"reasoning_tokens": 0},
                 "total_tokens": 51},
          ext={"cost": {"gpu_seconds": 12.5, "model_load_seconds": 4.1, "load_share": 0.328,
                        "instance_type": "g6e.xlarge", "capacity": "spot",
                        "estimated_cost_usd": 0.0042, "usd_per_1m_tokens": 82.35,
                        "usd_per_1m_output_tokens": 280.0, "estimate": True}})
    backdate(services, done, 3 * 3600, in_progress_at=3 * 3600 - 40, finalizing_at=2 * 3600 + 1500,
             completed_at=2 * 3600 + 1490)
    seed_worker_records(services, done, started=now() - 3 * 3600 + 40)

    bad = create_batch(services, 6, job="import")
    drive(services, bad, "failed", errors={"object": "list", "data": [
        {"code": "invalid_json_line", "message": "Line 2 is not valid JSON.", "param": None, "line": 2},
        {"code": "duplicate_custom_id", "message": "The custom_id 'req-1' is used more than once.",
         "param": "custom_id", "line": 5}]})
    backdate(services, bad, 95 * 60, failed_at=95 * 60 - 3)

    running = create_batch(services, 50, job="backfill")
    drive(services, running, "in_progress", request_counts={"total": 50, "completed": 0, "failed": 0},
          model=MODEL, live_completed=21, live_failed=1, live_input_tokens=4_410, live_output_tokens=1_650)
    backdate(services, running, 14 * 60, in_progress_at=14 * 60 - 20)

    fresh = create_batch(services, 3)
    return {"done": done, "bad": bad, "running": running, "fresh": fresh, "output": output, "errors": errors}


def seed_worker_records(services: Services, batch_id: str, started: int) -> None:
    """What Plan, two shard workers and Notify leave behind for a finished batch (the batch page reads them)."""
    blobs, table = services.adapters.blobs, services.adapters.table
    blobs.put_bytes(layout.manifest_key(batch_id), json.dumps(
        [{"batch_id": batch_id, "shard_id": "00000"}, {"batch_id": batch_id, "shard_id": "00001"}]).encode())
    for sid, lines, attempts in (("00000", 2, ("a1", "b2")), ("00001", 2, ("c3",))):
        blobs.put_bytes(layout.shard_key(batch_id, sid), json.dumps(
            {"batch_id": batch_id, "shard_id": sid, "lines": lines, "est_tokens": 60}).encode())
        prefix = layout.results_prefix(batch_id, sid)
        for n, attempt in enumerate(attempts):
            blobs.put_bytes(f"{prefix}{n:06d}-{attempt}.jsonl", b"{}\n")
            blobs.put_bytes(f"{prefix}acct-{attempt}.json", json.dumps(
                {"attempt": attempt, "model_load_seconds": 2.1, "inference_seconds": 3.4, "idle_seconds": 0.3,
                 "finished": n == len(attempts) - 1,
                 "phases": {"container_start": started + 20 * n, "weights_source": "cache", "weights_ready_s": 1.2,
                            "engine_ready_s": 2.1, "first_result_s": 3.0, "done_s": 6.5}}).encode())
            t = started + 30 + 20 * n + (5 if sid == "00001" else 0)
            blobs.put_bytes(f"{prefix}progress-{attempt}.json", json.dumps({"attempt": attempt, "samples": [
                [t, 1, 0, 5], [t + 6, 1, 0 if sid == "00000" else 1, 8]]}).encode())
        blobs.put_bytes(f"{prefix}_done.json", json.dumps({"lines": lines, "attempts": len(attempts)}).encode())
    table.put_record(EventRecord(pk=event_pk(batch_id, "completed"), tenant="default", event_id="evt_seeded",
                                 type="batch.completed", batch_id=batch_id, status="completed",
                                 created_at=started + 200, body="{}", emailed_to=["ops@example.com"]))
    table.put_record(WebhookEndpointRecord(
        pk="whep_seeded", tenant="default", created_at=started, event_types=["batch.completed"], name="ops",
        url="https://hooks.example.com/nightbatch", secret="whsec_seeded"))
    table.put_record(DeliveryRecord(
        pk=delivery_id("evt_seeded", "whep_seeded"), tenant="default", created_at=started + 201,
        endpoint_id="whep_seeded", event_id="evt_seeded", event_type="batch.completed", batch_id=batch_id,
        body="{}", status="succeeded", attempt_count=2, attempts=[
            {"attempt": 1, "attempted_at": started + 201, "status_code": 503, "duration_ms": 40},
            {"attempt": 2, "attempted_at": started + 231, "status_code": 200, "duration_ms": 12}]))


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=15_000)  # what a person sees, given a busy 2-core machine time to render it

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1360, "height": 820}, accept_downloads=True)
    pg = context.new_page()
    problems: list[str] = []
    pg.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    # The browser logs every 4xx fetch as an error; a refused key is an expected one.
    pg.on("console", lambda m: problems.append(f"console {m.type}: {m.text}")
          if m.type == "error" and not expected_failure(m) else None)
    try:
        yield pg
    finally:
        context.close()
    # A CSP violation or a script error shows up here even when everything visible looks right.
    assert problems == []


def expected_failure(message: Any) -> bool:
    """A refused key, and the estimate the submit dialog asks for where this deployment has none."""
    url = (message.location or {}).get("url", "")
    return "status of 401" in message.text or ("status of 404" in message.text and "/nightbatch/estimate" in url)


def assert_accessible(page: Any, what: str) -> None:
    """axe-core on the page as it is now: no serious or critical violations."""
    from axe_playwright_python.sync_playwright import Axe

    results = Axe().run(page)
    bad = [v for v in results.response["violations"] if v["impact"] in ("serious", "critical")]
    assert not bad, f"{what}: " + "; ".join(
        f"{v['id']} ({v['impact']}): {v['help']} at {[n['target'] for n in v['nodes']][:3]}" for v in bad)


def row(page: Any, batch_id: str) -> Any:
    return page.locator(f'tr.batch[data-id="{batch_id}"]')


def sign_in(page: Any, url: str, key: str) -> None:
    page.goto(url + "/")
    page.get_by_label("API key").fill(key)
    page.get_by_role("button", name="Show batches").click()


def save_screenshot(page: Any, name: str, *, viewport: bool = False) -> None:
    """The page down to the end of <main>, into tests/artifacts/ and, when asked (or missing), docs/.

    The copies in docs/ change on every run (times, ids): they are refreshed on request
    (NIGHTBATCH_UPDATE_SCREENSHOT=1), so that `make test` leaves the work tree clean."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    width = page.viewport_size["width"]
    height = page.viewport_size["height"] if viewport else page.evaluate(
        "Math.ceil(document.querySelector('main').getBoundingClientRect().bottom)")
    page.screenshot(path=str(ARTIFACTS / name), full_page=not viewport,
                    clip={"x": 0, "y": 0, "width": width, "height": height})
    if os.environ.get("NIGHTBATCH_UPDATE_SCREENSHOT") == "1" or not (ROOT / "docs" / name).exists():
        shutil.copyfile(ARTIFACTS / name, ROOT / "docs" / name)
