"""A batch's own page in a real browser: its life as a timeline and charts, shards, deliveries, result preview."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.dashboard.conftest import BROWSER, assert_accessible, row, save_screenshot, sign_in

if TYPE_CHECKING:
    from tests.conftest import ApiServer

pytestmark = BROWSER


def test_a_finished_batch_tells_its_story(page: Any, api_server: ApiServer, seeded: dict[str, Any]) -> None:
    from playwright.sync_api import expect

    sign_in(page, api_server.base_url, api_server.api_key)
    row(page, seeded["done"]).get_by_role("link", name=seeded["done"]).click()
    expect(page).to_have_url(f"{api_server.base_url}/dashboard/batches/{seeded['done']}")
    expect(page.locator("#b-status")).to_have_text("completed")

    steps = page.locator("#b-timeline li")
    expect(steps).to_have_count(5)
    expect(steps.nth(2)).to_contain_text("in progress")
    expect(steps.nth(4)).to_contain_text("completed")
    expect(page.locator("#b-timeline li.done")).to_have_count(5)

    stats = page.locator("#b-stats")
    expect(stats).to_contain_text("3 ok · 1 failed · 4 total")
    expect(stats).to_contain_text("$0.0042 (estimate)")
    expect(stats).to_contain_text("12.5 s · 33% loading the model")

    # Both charts drawn from the workers' progress samples (three attempts merged in time order).
    done_chart = page.locator("#b-charts svg").nth(0)
    expect(done_chart.locator("circle.pt")).to_have_count(7)  # the start plus six samples
    expect(page.locator("#b-charts svg").nth(1).locator("circle.pt")).not_to_have_count(0)
    expect(done_chart.locator("desc")).to_contain_text("latest 4 requests")

    shards = page.locator("#b-shards tbody tr")
    expect(shards).to_have_count(2)
    expect(shards.nth(0)).to_contain_text("completed")
    expect(shards.nth(0).locator("td").nth(3)).to_have_text("2")  # attempts
    expect(page.locator("#b-shards thead")).to_contain_text("model load")
    expect(page.locator("#b-shards thead")).to_contain_text("engine ready at")

    out = page.locator('.preview[data-file="file-dashboardOutput000000"] li.pline')
    expect(out).to_have_count(3)
    expect(out.nth(0).locator(".ptext")).to_have_text("Answer 0")
    expect(out.nth(0)).to_contain_text("req-0")
    err = page.locator('.preview[data-file="file-dashboardErrors000000"] li.pline')
    expect(err).to_have_count(1)
    expect(err.nth(0).locator(".ptext.error")).to_contain_text("maximum context length is 2048 tokens")

    expect(page.locator("#b-meta")).to_contain_text("nightly-eval")
    notify = page.locator("#b-notify")
    expect(notify).to_contain_text("batch.completed")
    expect(notify).to_contain_text("https://hooks.example.com/nightbatch")
    expect(notify).to_contain_text("HTTP 503")
    expect(notify).to_contain_text("HTTP 200")
    expect(notify).to_contain_text("E-mail to ops@example.com: sent")
    save_screenshot(page, "dashboard-batch.png")

    assert_accessible(page, "batch page")
    with page.expect_download() as download:
        page.locator('.preview[data-file="file-dashboardOutput000000"]').get_by_role(
            "button", name="Download all").click()
    assert Path(download.value.path()).read_bytes() == seeded["output"]


def test_a_rejected_input_shows_its_line_errors(page: Any, api_server: ApiServer, seeded: dict[str, Any]) -> None:
    from playwright.sync_api import expect

    sign_in(page, api_server.base_url, api_server.api_key)
    expect(page.locator("tr.batch")).to_have_count(4)
    page.goto(f"{api_server.base_url}/dashboard/batches/{seeded['bad']}")
    expect(page.locator("#b-status")).to_have_text("failed")
    errors = page.locator("#b-errors li")
    expect(errors).to_have_count(2)
    expect(errors.nth(0)).to_have_text("line 2invalid_json_lineLine 2 is not valid JSON.")
    expect(page.locator("#b-shards")).to_contain_text("No shards were planned.")
    page.get_by_role("link", name="All batches").click()
    expect(page.locator("tr.batch")).to_have_count(4)


def test_the_pages_fit_a_phone(browser: Any, api_server: ApiServer, seeded: dict[str, Any]) -> None:
    from playwright.sync_api import expect

    context = browser.new_context(viewport={"width": 390, "height": 844})
    try:
        page = context.new_page()
        sign_in(page, api_server.base_url, api_server.api_key)
        expect(page.locator("tr.batch")).to_have_count(4)
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        page.goto(f"{api_server.base_url}/dashboard/batches/{seeded['done']}")
        expect(page.locator("#b-charts circle.pt")).not_to_have_count(0)
        expect(page.locator('.preview li.pline')).to_have_count(4)
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
    finally:
        context.close()


def test_a_running_batch_previews_its_results_so_far(api_server: ApiServer, page: Any) -> None:
    # api_server first: the page (still polling a running batch) closes before the server's services go
    from playwright.sync_api import expect

    from nightbatch import layout
    from nightbatch.shards.spec import ShardItem, ShardSpec, write_manifest, write_shard
    from tests.dashboard.conftest import create_batch, output_line
    from tests.support.lifecycle import drive

    services = api_server.services
    blobs = services.adapters.blobs
    batch_id = create_batch(services, 4)
    write_manifest(blobs, batch_id, [ShardItem(batch_id=batch_id, shard_id="00000")])
    write_shard(blobs, ShardSpec(batch_id=batch_id, shard_id="00000",
                                 endpoint="/v1/chat/completions", model="m", segments=[], lines=4))
    drive(services, batch_id, "in_progress", request_counts={"total": 4, "completed": 0, "failed": 0},
          live_completed=2)
    prefix = layout.results_prefix(batch_id, "00000")
    blobs.put_bytes(layout.checkpoint_key(prefix, 0, "a"), output_line(batch_id, 0) + output_line(batch_id, 1))

    sign_in(page, api_server.base_url, api_server.api_key)
    expect(page.locator("tr.batch")).to_have_count(1)  # the list's first load done before navigating away
    page.goto(f"{api_server.base_url}/dashboard/batches/{batch_id}")
    partial = page.locator('.preview.partial[data-kind="output"] li.pline')
    expect(partial).to_have_count(2)
    expect(partial.nth(0).locator(".ptext")).to_have_text("Answer 0")
    expect(page.locator("#b-preview")).to_contain_text(f"nightbatch results {batch_id} --partial")

    # A new checkpoint moves the counters: the preview follows.
    blobs.put_bytes(layout.checkpoint_key(prefix, 1, "a"), output_line(batch_id, 2))
    services.adapters.table.update(batch_id, set_={"live_completed": 3})
    expect(partial).to_have_count(3)
    assert_accessible(page, "batch page with results so far")
