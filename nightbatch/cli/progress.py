"""Following a batch until it ends: rich's progress bar on a terminal, plain lines elsewhere."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

import openai
from openai.types import Batch
from rich.console import Console
from rich.progress import BarColumn, TaskID, TaskProgressColumn, TextColumn
from rich.progress import Progress as RichProgress

from nightbatch.cli.connection import Interrupted
from nightbatch.cli.render import STATUS_STYLE, clock, live_tokens, rate
from nightbatch.wire import TERMINAL_STATUSES

# Rates come from the last minute of polls, so the ETA follows the current speed rather than the average
# since the start (which the validation phase and engine warm-up would drag down).
RATE_WINDOW_SECONDS = 60.0
# Without a terminal, one line per status change and at most one per this many seconds in between.
LINE_EVERY_SECONDS = 10.0


@dataclass(frozen=True)
class Snapshot:
    status: str
    completed: int
    failed: int
    total: int
    requests_per_s: float | None
    tokens_per_s: float | None
    eta_seconds: float | None

    @property
    def done(self) -> int:
        return self.completed + self.failed

    def counts(self) -> str:
        if not self.total:
            return "waiting for validation" if self.status == "validating" else "no requests"
        text = f"{self.done:,}/{self.total:,} done"
        return text + (f" · {self.failed:,} failed" if self.failed else "")

    def speed(self) -> str | None:
        if not self.done:
            return None
        if self.tokens_per_s is not None:
            return rate(self.tokens_per_s, "tok")
        if self.requests_per_s is not None:
            return rate(self.requests_per_s, "req")
        return None

    def eta(self) -> str | None:
        if self.status not in ("in_progress", "validating") or self.eta_seconds is None:
            return None
        return f"ETA {clock(self.eta_seconds)}"


class Progress:
    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        self.now = now
        self.samples: deque[tuple[float, int, int | None]] = deque()
        self.status = ""

    def update(self, batch: Batch) -> Snapshot:
        c = batch.request_counts
        completed, failed, total = (c.completed, c.failed, c.total) if c else (0, 0, 0)
        t, done, tokens = self.now(), completed + failed, live_tokens(batch)
        if batch.status != self.status:
            self.samples.clear()  # time spent validating says nothing about the speed of the run
            self.status = batch.status
        self.samples.append((t, done, tokens))
        while len(self.samples) > 2 and t - self.samples[1][0] >= RATE_WINDOW_SECONDS:
            self.samples.popleft()
        t0, done0, _ = self.samples[0]
        req_rate = (done - done0) / (t - t0) if t > t0 else None
        # Token counters appear with the first checkpoint: measure from the oldest sample that had them.
        tok_rate = None
        if tokens is not None:
            t1, _, tokens1 = next(s for s in self.samples if s[2] is not None)
            tok_rate = (tokens - (tokens1 or 0)) / (t - t1) if t > t1 else None
        eta = (total - done) / req_rate if req_rate and total > done else None
        return Snapshot(batch.status, completed, failed, total, req_rate, tok_rate, eta)


class BarView:
    """One live line on a terminal: `in_progress ━━━━━━╸━━━━━  52% 520/1,000 done · 1.2k tok/s · ETA 0:42`."""

    def __init__(self, stream: TextIO) -> None:
        self.bar = RichProgress(
            TextColumn("[{task.fields[style]}]{task.fields[status]:<11}"),
            BarColumn(bar_width=30, complete_style="cyan", finished_style="green"),
            TaskProgressColumn(), TextColumn("{task.fields[info]}"),
            console=Console(file=stream, highlight=False), auto_refresh=False,
        )
        self.task: TaskID | None = None

    def show(self, snap: Snapshot) -> None:
        status, style = snap.status, STATUS_STYLE.get(snap.status, "")
        info = "  ".join(p for p in (snap.counts(), snap.speed(), snap.eta()) if p)
        if self.task is None:
            self.bar.start()
            self.task = self.bar.add_task("", total=snap.total or None, completed=snap.done, status=status,
                                          style=style, info=info)
        else:
            self.bar.update(self.task, completed=snap.done, total=snap.total or None, status=status, style=style,
                            info=info)
        self.bar.refresh()

    def close(self) -> None:
        if self.task is not None:
            self.bar.stop()


class LineView:
    """For logs and pipes: a timestamped line when something worth reading changed."""

    def __init__(self, stream: TextIO, now: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream
        self.now = now
        self.last: tuple[str, int] | None = None
        self.last_at = 0.0

    def show(self, snap: Snapshot) -> None:
        state = (snap.status, snap.done)
        t = self.now()
        if state == self.last:
            return
        if self.last is not None and snap.status == self.last[0] and t - self.last_at < LINE_EVERY_SECONDS:
            return
        parts = [time.strftime("%H:%M:%S"), snap.status, snap.counts(), snap.speed(), snap.eta()]
        self.stream.write("  ".join(p for p in parts if p) + "\n")
        self.stream.flush()
        self.last, self.last_at = state, t

    def close(self) -> None:
        pass


def follow(client: openai.OpenAI, batch: Batch, *, interval: float, stream: TextIO) -> Batch:
    """Polls until the batch reaches a terminal status, showing progress on `stream`."""
    progress = Progress()
    view: BarView | LineView = BarView(stream) if stream.isatty() else LineView(stream)
    try:
        while True:
            view.show(progress.update(batch))
            if batch.status in TERMINAL_STATUSES:
                return batch
            time.sleep(interval)
            batch = client.batches.retrieve(batch.id)
    except KeyboardInterrupt:
        raise Interrupted(f"stopped following {batch.id}; it keeps running. "
                          f"Follow it again with `nightbatch status {batch.id} --wait`.") from None
    finally:
        view.close()
