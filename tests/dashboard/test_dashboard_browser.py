"""The dashboard in a real browser (Debian's chromium, headless, driven by Playwright) against a live API."""

from __future__ import annotations

import io
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from nightbatch.batches import CreateBatchRequest
from nightbatch.clock import now, sort_key
from nightbatch.services import Services
from tests.support.lifecycle import drive

if TYPE_CHECKING:
    from tests.conftest import ApiServer

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-quic", "--no-first-run", "--disable-component-update", "--disable-sync"]
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "artifacts"
MODEL = "SmolLM2-135M-Instruct"

pytestmark = [
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
          if m.type == "error" and "status of 401" not in m.text else None)
    try:
        yield pg
    finally:
        context.close()
    # A CSP violation or a script error shows up here even when everything visible looks right.
    assert problems == []


def row(page: Any, batch_id: str) -> Any:
    return page.locator(f'tr.batch[data-id="{batch_id}"]')


def sign_in(page: Any, url: str, key: str) -> None:
    page.goto(url + "/")
    page.get_by_label("API key").fill(key)
    page.get_by_role("button", name="Show batches").click()


def test_wrong_key_is_refused_on_the_page(page: Any, api_server: ApiServer) -> None:
    from playwright.sync_api import expect

    sign_in(page, api_server.base_url, "nb-not-a-key")
    expect(page.get_by_role("alert")).to_have_text("That API key was not accepted.")
    expect(page.locator("#board")).to_be_hidden()


def test_a_person_sees_cancels_and_downloads(page: Any, api_server: ApiServer, seeded: dict[str, Any]) -> None:
    from playwright.sync_api import expect

    sign_in(page, api_server.base_url, api_server.api_key)
    rows = page.locator("tr.batch")
    expect(rows).to_have_count(4)

    done = row(page, seeded["done"])
    expect(done.locator(".status")).to_have_text("completed")
    expect(done.locator(".progress-text")).to_have_text("4 / 4 done (100%)")
    expect(done).to_contain_text("3 ok · 1 failed")
    expect(done).to_contain_text("51")  # total tokens
    expect(done).to_contain_text("in 36 · out 15")
    expect(done).to_contain_text("$0.0042")
    expect(done).to_contain_text("12.5 GPU-s · estimate")
    expect(done).to_contain_text("job=nightly-eval")
    expect(done.get_by_role("button", name="Cancel")).to_have_count(0)

    bad = row(page, seeded["bad"])
    expect(bad.locator(".status")).to_have_text("failed")
    errors = page.locator(f'tbody[data-id="{seeded["bad"]}"] tr.errors li')
    expect(errors).to_have_count(2)
    expect(errors.nth(0)).to_have_text("line 2invalid_json_lineLine 2 is not valid JSON.")
    expect(errors.nth(1)).to_contain_text("duplicate_custom_id")

    running = row(page, seeded["running"])
    expect(running.locator(".status")).to_have_text("in progress")
    expect(running.locator(".progress-text")).to_have_text("22 / 50 done (44%)")
    expect(running).to_contain_text("6,060")  # live tokens while it runs
    expect(running).to_contain_text("in 4,410 · out 1,650")
    expect(row(page, seeded["fresh"]).locator(".progress-text")).to_have_text("validating input…")

    # Live refresh: the workers move on, the page follows without a reload.
    api_server.services.adapters.table.update(seeded["running"], set_={"live_completed": 30})
    expect(running.locator(".progress-text")).to_have_text("31 / 50 done (62%)", timeout=10_000)

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    height = page.evaluate("Math.ceil(document.querySelector('main').getBoundingClientRect().bottom)")
    page.screenshot(path=str(ARTIFACTS / "dashboard.png"), clip={"x": 0, "y": 0, "width": 1360, "height": height})
    # The README's copy changes on every run (times, ids): refresh it on request, so that `make test` leaves
    # the work tree clean and branches do not collide on a binary file.
    if os.environ.get("NIGHTBATCH_UPDATE_SCREENSHOT") == "1" or not (ROOT / "docs" / "dashboard.png").exists():
        shutil.copyfile(ARTIFACTS / "dashboard.png", ROOT / "docs" / "dashboard.png")

    with page.expect_download() as download:
        done.get_by_role("button", name="Output").click()
    assert Path(download.value.path()).read_bytes() == seeded["output"]
    with page.expect_download() as download:
        done.get_by_role("button", name="Errors").click()
    assert Path(download.value.path()).read_bytes() == seeded["errors"]

    page.once("dialog", lambda d: d.accept())
    running.get_by_role("button", name="Cancel").click()
    expect(running.locator(".status")).to_have_text("cancelling")
    expect(running.get_by_role("button", name="Cancel")).to_have_count(0)
    expect(page.locator("#notice")).to_contain_text(f"Cancelling {seeded['running']}")
    assert api_server.services.batches.get("default", seeded["running"]).status == "cancelling"


def test_the_key_stays_in_the_tab_and_can_be_forgotten(
    page: Any, api_server: ApiServer, seeded: dict[str, Any]
) -> None:
    from playwright.sync_api import expect

    sign_in(page, api_server.base_url, api_server.api_key)
    expect(page.locator("tr.batch")).to_have_count(4)
    page.reload()  # sessionStorage survives a reload of the same tab
    expect(page.locator("tr.batch")).to_have_count(4)
    page.get_by_role("button", name="Forget key").click()
    expect(page.get_by_label("API key")).to_be_visible()
    assert page.evaluate("sessionStorage.length") == 0
