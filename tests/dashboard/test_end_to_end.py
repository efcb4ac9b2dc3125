"""The dashboard on `nightbatch local` with the real CPU engine: submit from the browser, watch the batch to
`completed` with its charts, read the preview; a bad file's line errors. Shares the session's one local stack."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from tests.dashboard.conftest import BROWSER, assert_accessible, sign_in

if TYPE_CHECKING:
    from tests.e2e.conftest import LocalStack

pytestmark = [pytest.mark.e2e, *BROWSER]
CHAT = "SmolLM2-135M-Instruct"


def chat_lines(n: int) -> bytes:
    return b"".join(json.dumps({
        "custom_id": f"colour-{i}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": CHAT, "messages": [{"role": "user", "content": f"Name a colour. Number {i}."}],
                 "max_tokens": 24, "temperature": 0}}).encode() + b"\n" for i in range(n))


def submit(page: Any, base: str, name: str, data: bytes) -> None:
    from playwright.sync_api import expect

    page.goto(base + "/dashboard")
    page.get_by_role("button", name="New batch").click()
    page.get_by_label("Choose a JSONL file").set_input_files(
        files=[{"name": name, "mimeType": "application/jsonl", "buffer": data}])
    expect(page.locator("#upload-text")).to_contain_text("Uploaded as file-")
    page.get_by_role("button", name="Create batch").click()
    expect(page.locator("#b-status")).to_be_visible()


def test_submit_in_the_browser_and_watch_it_finish(page: Any, local_stack: LocalStack) -> None:
    from playwright.sync_api import expect

    base = local_stack.base_url.removesuffix("/v1")
    sign_in(page, base, local_stack.api_key)
    expect(page.locator("#board")).to_be_visible()
    submit(page, base, "colours.jsonl", chat_lines(6))
    expect(page.locator("#b-status")).to_have_text("completed", timeout=600_000)
    batch_id = page.url.rsplit("/", 1)[-1]
    assert batch_id.startswith("batch_")

    # Drawn from the worker's own progress samples: at least the start and one checkpoint.
    charts = page.locator("#b-charts svg")
    expect(charts).to_have_count(2)
    assert charts.nth(0).locator("circle.pt").count() >= 2
    expect(page.locator("#b-timeline li.done")).to_have_count(5)
    expect(page.locator("#b-shards tbody tr").first).to_contain_text("completed")
    lines = page.locator("#b-preview li.pline")
    expect(lines).to_have_count(6)
    for i in range(6):
        assert lines.nth(i).locator(".ptext.text").inner_text().strip()  # the model's words, readable
    expect(page.locator("#b-stats")).to_contain_text("6 ok · 0 failed · 6 total")
    assert_accessible(page, "batch page after a real run")

    bad = chat_lines(3).replace(b'"custom_id": "colour-1"', b'"custom_id": colour-1', 1)
    submit(page, base, "broken.jsonl", bad)
    expect(page.locator("#b-status")).to_have_text("failed", timeout=120_000)
    errors = page.locator("#b-errors li")
    expect(errors.first).to_contain_text("line 2")
