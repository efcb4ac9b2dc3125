"""The submit dialog in a real browser: pick a file, it uploads (one request or the Uploads API), create."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from tests.dashboard.conftest import BROWSER, assert_accessible, save_screenshot, sign_in

if TYPE_CHECKING:
    from tests.conftest import ApiServer

pytestmark = BROWSER
EMBED = "all-MiniLM-L6-v2"


def embedding_lines(n: int, pad: int = 0) -> bytes:
    return b"".join(json.dumps({"custom_id": f"e-{i}", "method": "POST", "url": "/v1/embeddings",
                                "body": {"model": EMBED, "input": f"text {i} " + "x" * pad}}).encode() + b"\n"
                    for i in range(n))


def test_pick_a_file_fill_the_form_and_create(page: Any, api_server: ApiServer) -> None:
    from playwright.sync_api import expect

    sign_in(page, api_server.base_url, api_server.api_key)
    expect(page.locator("#empty")).to_be_visible()
    # Keyboard only: the button opens the dialog, Escape closes it, focus comes back.
    page.get_by_role("button", name="New batch").focus()
    page.keyboard.press("Enter")
    dialog = page.get_by_role("dialog", name="New batch")
    expect(dialog).to_be_visible()
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()
    page.get_by_role("button", name="New batch").click()

    data = embedding_lines(3)
    page.get_by_label("Choose a JSONL file").set_input_files(
        files=[{"name": "texts.jsonl", "mimeType": "application/jsonl", "buffer": data}])
    expect(page.locator("#upload-text")).to_contain_text("Uploaded as file-")
    expect(page.get_by_label("Endpoint")).to_have_value("/v1/embeddings")  # from the first line
    expect(page.locator("#estimate")).to_contain_text("Requests3")  # POST /v1/nightbatch/estimate
    expect(page.locator("#estimate .line-errors")).to_have_count(0)
    page.get_by_label("Completion window").select_option("72h")
    page.get_by_label("Metadata key 1").fill("job")
    page.get_by_label("Metadata value 1").fill("from-the-browser")
    assert_accessible(page, "submit dialog")
    save_screenshot(page, "dashboard-submit.png", viewport=True)
    page.get_by_role("button", name="Create batch").click()

    expect(page.locator("#b-status")).to_have_text("validating")
    (batch,) = api_server.services.batches.list("default", limit=10, after=None).data
    assert page.url == f"{api_server.base_url}/dashboard/batches/{batch.id}"
    assert (batch.endpoint, batch.completion_window, batch.metadata) == (
        "/v1/embeddings", "72h", {"job": "from-the-browser"})
    assert b"".join(api_server.services.files.chunks(
        api_server.services.files.item("default", batch.input_file_id))) == data
    expect(page.locator("#b-meta")).to_contain_text("from-the-browser")
    expect(page.locator("#b-timeline li.current")).to_contain_text("validating")


def test_a_large_file_goes_through_the_uploads_api(page: Any, api_server: ApiServer) -> None:
    from playwright.sync_api import expect

    sign_in(page, api_server.base_url, api_server.api_key)
    page.get_by_role("button", name="New batch").click()
    data = embedding_lines(4_000, pad=900)  # ~3.7 MB: past the single-request size, two parts
    assert len(data) > 3 * 1024 * 1024
    page.get_by_label("Choose a JSONL file").set_input_files(
        files=[{"name": "big.jsonl", "mimeType": "application/jsonl", "buffer": data}])
    expect(page.locator("#upload-text")).to_contain_text("Uploaded as file-", timeout=60_000)
    assert page.locator("#upload-progress").evaluate("p => p.value") == 100
    page.get_by_role("button", name="Create batch").click()
    expect(page.locator("#b-status")).to_have_text("validating")
    paths = [r.path for r in api_server.requests if r.method == "POST"]
    assert sum(1 for p in paths if p.endswith("/parts")) == 2
    assert not any(p == "/v1/files" for p in paths)
    (batch,) = api_server.services.batches.list("default", limit=10, after=None).data
    item = api_server.services.files.item("default", batch.input_file_id)
    assert item.bytes == len(data)
