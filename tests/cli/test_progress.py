"""The pieces of the CLI that need no server: rates and ETA, the bar, the line view, formatting, arguments."""

from __future__ import annotations

import argparse
import io
import re
from typing import Any

import pytest
from openai.types import Batch

from nightbatch.cli.commands import key_value, size
from nightbatch.cli.connection import CommandError, api_root
from nightbatch.cli.progress import BarView, LineView, Progress, Snapshot
from nightbatch.cli.render import (
    clock,
    cost,
    cost_detail,
    describe,
    duration,
    human_bytes,
    live_tokens,
    show,
    table,
)


def batch(
    status: str = "in_progress", done: int = 0, total: int = 100, failed: int = 0, **extra: Any
) -> Batch:
    return Batch.model_validate({
        "id": "batch_1", "object": "batch", "endpoint": "/v1/chat/completions", "input_file_id": "file-1",
        "completion_window": "24h", "status": status, "created_at": 1_700_000_000,
        "request_counts": {"total": total, "completed": done - failed, "failed": failed}, **extra,
    })


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_rates_and_eta_follow_the_last_minute() -> None:
    clock_ = Clock()
    progress = Progress(now=clock_)
    first = progress.update(batch(done=0, nightbatch={"live_usage": {"total_tokens": 0}}))
    assert (first.requests_per_s, first.tokens_per_s, first.eta_seconds) == (None, None, None)
    clock_.t += 10
    snap = progress.update(batch(done=20, nightbatch={"live_usage": {"total_tokens": 5000}}))
    assert (snap.requests_per_s, snap.tokens_per_s, snap.eta_seconds) == (2.0, 500.0, 40.0)
    assert (snap.speed(), snap.eta()) == ("500 tok/s", "ETA 0:40")
    for _ in range(7):  # the run speeds up; after a minute only the fast part counts
        clock_.t += 10
        snap = progress.update(batch(done=snap.done + 40))
    assert snap.requests_per_s == pytest.approx(4.0)
    assert snap.tokens_per_s is None  # no live tokens in the latest sample: requests per second instead
    assert snap.speed() == "4.0 req/s"


def test_tokens_per_second_start_with_the_first_counters() -> None:
    clock_ = Clock()
    progress = Progress(now=clock_)
    progress.update(batch(done=0))  # nothing checkpointed yet: no token counters on the batch
    clock_.t += 10
    progress.update(batch(done=10, nightbatch={"live_usage": {"total_tokens": 1000}}))
    clock_.t += 5
    snap = progress.update(batch(done=20, nightbatch={"live_usage": {"total_tokens": 3000}}))
    assert (snap.tokens_per_s, snap.requests_per_s) == (400.0, pytest.approx(20 / 15))


def test_a_new_status_starts_the_rate_afresh() -> None:
    clock_ = Clock()
    progress = Progress(now=clock_)
    progress.update(batch("validating", total=0))
    clock_.t += 120  # two minutes of validation do not make the run look slow
    assert progress.update(batch(done=0)).requests_per_s is None
    clock_.t += 5
    assert progress.update(batch(done=50)).requests_per_s == 10.0


class Terminal(io.StringIO):
    encoding = "ascii"

    def isatty(self) -> bool:
        return True


def snap(status: str, done: int, total: int = 100, failed: int = 0) -> Snapshot:
    return Snapshot(status, done - failed, failed, total, 2.0 if done else None, None, 30.0 if done else None)


def plain(rendered: str) -> list[str]:
    """The lines rich drew, without its control codes, one per redraw."""
    text = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", rendered)
    return [line.rstrip() for line in text.replace("\n", "\r").split("\r") if line.strip()]


def test_the_bar_redraws_one_line_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "120")
    term = Terminal()
    view = BarView(term)
    view.show(snap("in_progress", 50, failed=3))
    view.show(snap("completed", 100))
    view.close()
    lines = plain(term.getvalue())
    assert lines[0].startswith("in_progress ")
    assert lines[0].endswith(" 50% 50/100 done · 3 failed  2.0 req/s  ETA 0:30")
    assert lines[-1].startswith("completed ") and lines[-1].endswith("100% 100/100 done  2.0 req/s")
    assert term.getvalue().endswith("\n\x1b[?25h")  # a newline after the last redraw, the cursor back


def test_the_bar_fits_a_narrow_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    term = Terminal()
    view = BarView(term)
    view.show(Snapshot("in_progress", 520_000, 3_000, 1_000_000, 900.0, 12_345.0, 3723.0))
    view.close()
    line = plain(term.getvalue())[-1]
    assert len(line) <= 80
    assert line.endswith("52% 523,000/1,000,000 done · 3,000 failed  12k tok/s  ETA 1:02:03")


def test_status_and_list_are_plain_text_off_a_terminal() -> None:
    out = io.StringIO()
    b = batch(done=5)
    show(out, b)
    assert out.getvalue() == describe(b) + "\n"
    out = io.StringIO()
    show(out, batches=[b])
    assert out.getvalue() == table([b]) + "\n"
    assert "\x1b[" not in out.getvalue()


def test_status_and_list_are_coloured_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "160")
    term = Terminal()
    b = batch(done=5)
    show(term, batches=[b])
    assert "\x1b[36min_progress" in term.getvalue()  # cyan
    header = next(line for line in plain(term.getvalue()) if "STATUS" in line)
    assert re.findall(r"[A-Z]+", header) == ["ID", "STATUS", "PROGRESS", "CREATED", "ENDPOINT"]


def test_lines_without_a_terminal_come_on_change_and_not_too_often() -> None:
    out = io.StringIO()
    clock_ = Clock()
    view = LineView(out, now=clock_)
    view.show(snap("validating", 0, total=0))
    view.show(snap("in_progress", 0))
    clock_.t += 3
    view.show(snap("in_progress", 10))  # same status, 3 s later: skipped
    clock_.t += 10
    view.show(snap("in_progress", 60))
    view.show(snap("completed", 100))
    lines = [line.split(maxsplit=1)[1] for line in out.getvalue().splitlines()]
    assert lines == [
        "validating  waiting for validation",
        "in_progress  0/100 done",
        "in_progress  60/100 done  2.0 req/s  ETA 0:30",
        "completed  100/100 done  2.0 req/s",
    ]


def test_formatting() -> None:
    assert [human_bytes(n) for n in (512, 2048, 5 * 1024**2 + 1, 3 * 1024**3)] == [
        "512 B", "2.0 KiB", "5.0 MiB", "3.0 GiB"]
    assert [duration(s) for s in (4, 75, 3 * 3600 + 120, 2 * 86400 + 7200)] == [
        "4s", "1m 15s", "3h 02m", "2d 2h"]
    assert [clock(s) for s in (42, 725, 3723)] == ["0:42", "12:05", "1:02:03"]
    estimate = {"gpu_seconds": 9.25, "estimated_cost_usd": 0.0042, "usd_per_1m_tokens": 0.41, "estimate": True}
    assert cost(batch(nightbatch={"cost": estimate})) == "$0.0042"
    assert cost_detail(batch(nightbatch={"cost": estimate})) == (
        "$0.0042 (estimate) · 9.2 GPU-seconds · $0.41 per 1M tokens")
    assert cost(batch(nightbatch={"cost": {"estimated_cost_usd": 12.5}})) == "$12.50"
    assert cost(batch()) is None
    assert live_tokens(batch(usage={"input_tokens": 1, "output_tokens": 2, "total_tokens": 3,
                                    "input_tokens_details": {"cached_tokens": 0},
                                    "output_tokens_details": {"reasoning_tokens": 0}})) == 3


def test_arguments() -> None:
    assert [size(s) for s in ("4MiB", "512KiB", "1000", "2 kb", "1.5m")] == [
        4 * 1024**2, 512 * 1024, 1000, 2000, int(1.5 * 1024**2)]
    for bad in ("", "0", "-1", "4 parsecs"):
        with pytest.raises(argparse.ArgumentTypeError):
            size(bad)
    assert key_value("job=a=b") == ("job", "a=b")
    with pytest.raises(argparse.ArgumentTypeError):
        key_value("job")
    assert api_root("http://127.0.0.1:8000") == "http://127.0.0.1:8000/v1"
    assert api_root("https://x.execute-api.eu-west-1.amazonaws.com/prod/") == (
        "https://x.execute-api.eu-west-1.amazonaws.com/prod/v1")
    assert api_root("http://h/v1/") == "http://h/v1"
    with pytest.raises(CommandError):
        api_root("localhost:8000")


def test_status_shows_phase_timings() -> None:
    from nightbatch.cli.render import describe

    phases = {"attempts": 1, "median_s": {"weights_ready": 0.1, "engine_ready": 2.0, "first_result": 2.5,
                                          "done": 9.0}, "max_s": {}, "weights_sources": {"local": 1}}
    block = describe(batch(status="completed", nightbatch={"phases": phases}, completed_at=1_700_000_100))
    assert "weights 0.1 s → engine 2.0 s → first result 2.5 s → done 9.0 s (median of 1 attempt; " \
           "weights from local)" in block
