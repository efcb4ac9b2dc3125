"""The dashboard in a real browser (Debian's chromium, headless, driven by Playwright) against a live API."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.dashboard.conftest import BROWSER, assert_accessible, row, save_screenshot, sign_in

if TYPE_CHECKING:
    from tests.conftest import ApiServer

pytestmark = BROWSER


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

    assert_accessible(page, "batch list")
    save_screenshot(page, "dashboard.png")

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
