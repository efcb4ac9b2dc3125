"""How the batch commands show a batch to people: sizes, durations, counts, the status block, the table."""

from __future__ import annotations

import time
from typing import Any, TextIO

from openai.types import Batch
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from nightbatch.phases import describe as describe_phases

# Colours on a terminal (rich styles); nothing else changes with them.
STATUS_STYLE = {
    "validating": "blue", "in_progress": "cyan", "finalizing": "cyan", "completed": "green", "failed": "red",
    "expired": "yellow", "cancelling": "yellow", "cancelled": "yellow",
}
ENDED_AT = {"completed": "completed_at", "failed": "failed_at", "expired": "expired_at",
            "cancelled": "cancelled_at"}
ERRORS_SHOWN = 5


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def duration(seconds: float) -> str:
    s = max(0, round(seconds))
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {s:02d}s"
    return f"{s}s"


def clock(seconds: float) -> str:
    """An ETA as a clock, like most progress bars: 0:42, 12:05, 1:02:03."""
    s = max(0, round(seconds))
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    return f"{hours}:{minutes:02d}:{s:02d}" if hours else f"{minutes}:{s:02d}"


def rate(per_second: float, unit: str) -> str:
    if per_second >= 10_000:
        return f"{per_second / 1000:.0f}k {unit}/s"
    if per_second >= 1000:
        return f"{per_second / 1000:.1f}k {unit}/s"
    if per_second >= 10:
        return f"{per_second:.0f} {unit}/s"
    return f"{per_second:.1f} {unit}/s"


def timestamp(ts: int | None) -> str:
    if ts is None:
        return "-"
    local = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))
    delta = time.time() - ts
    relative = f"in {duration(-delta)}" if delta < 0 else f"{duration(delta)} ago"
    return f"{local} ({relative})"


def ago(ts: int) -> str:
    return f"{duration(time.time() - ts)} ago"


def live_tokens(batch: Batch) -> int | None:
    """Tokens so far: `usage` once finalized; during a run, `nightbatch.live_usage` (the workers' counters)."""
    if batch.usage is not None:
        return batch.usage.total_tokens
    usage = _ext(batch).get("live_usage")
    if isinstance(usage, dict) and isinstance(usage.get("total_tokens"), int):
        return int(usage["total_tokens"])
    return None


def cost(batch: Batch) -> str | None:
    """`batch.nightbatch.cost.estimated_cost_usd` (from the GPU-seconds the shards recorded) as "$0.0042"."""
    value = _ext(batch).get("cost")
    if isinstance(value, dict):
        value = value.get("estimated_cost_usd")
    if isinstance(value, int | float):
        return f"${value:.2f}" if value >= 1 or value == 0 else f"${value:.2g}"
    return None


def cost_detail(batch: Batch) -> str | None:
    """The status block's cost line: the estimate and what it was made from."""
    amount = cost(batch)
    details = _ext(batch).get("cost")
    if amount is None or not isinstance(details, dict):
        return amount
    parts = [amount + (" (estimate)" if details.get("estimate") else "")]
    if isinstance(details.get("gpu_seconds"), int | float):
        parts.append(f"{details['gpu_seconds']:,.1f} GPU-seconds")
    per_million = details.get("usd_per_1m_tokens")
    if isinstance(per_million, int | float):
        parts.append(f"${per_million:.2f} per 1M tokens")
    return " · ".join(parts)


def _ext(batch: Batch) -> dict[str, Any]:
    ext = getattr(batch, "nightbatch", None)  # our extension key arrives as an extra field on the SDK model
    return ext if isinstance(ext, dict) else {}


def progress(batch: Batch) -> str:
    c = batch.request_counts
    if c is None or not c.total:
        return "-"
    done = c.completed + c.failed
    return f"{done:,}/{c.total:,} ({100 * done // c.total}%)"


def counts(batch: Batch) -> str:
    c = batch.request_counts
    if c is None or not c.total:
        return "none yet" if batch.status in ("validating",) else "none"
    return f"{c.completed:,} completed, {c.failed:,} failed, {c.total:,} total"


def tokens(batch: Batch) -> str | None:
    if batch.usage is not None:
        u = batch.usage
        reasoning = u.output_tokens_details.reasoning_tokens
        extra = f", of which reasoning {reasoning:,}" if reasoning else ""
        return f"{u.total_tokens:,} (input {u.input_tokens:,}, output {u.output_tokens:,}{extra})"
    n = live_tokens(batch)
    return f"{n:,} so far" if n is not None else None


def took(batch: Batch) -> str | None:
    ended = ENDED_AT.get(batch.status)
    end = getattr(batch, ended) if ended else None
    return duration(end - batch.created_at) if end else None


def error_lines(batch: Batch, limit: int = ERRORS_SHOWN) -> list[str]:
    data = batch.errors.data if batch.errors and batch.errors.data else []
    lines = [(f"line {e.line}: " if e.line else "") + f"{e.code}: {e.message}" for e in data[:limit]]
    if len(data) > limit:
        lines.append(f"... and {len(data) - limit} more")
    return lines


def describe(batch: Batch) -> str:
    """The `nightbatch status` block."""
    rows: list[tuple[str, str | None]] = [
        ("endpoint", batch.endpoint + (f"  (model {batch.model})" if batch.model else "")),
        ("requests", counts(batch)),
        ("tokens", tokens(batch)),
        ("cost", cost_detail(batch)),
        ("phases", describe_phases(_ext(batch).get("phases") or {})),
        ("created", timestamp(batch.created_at)),
        ("started", timestamp(batch.in_progress_at) if batch.in_progress_at else None),
    ]
    ended = ENDED_AT.get(batch.status)
    if ended:
        rows.append((batch.status, f"{timestamp(getattr(batch, ended))}, took {took(batch)}"))
    else:
        rows.append(("expires", timestamp(batch.expires_at) if batch.expires_at else None))
    rows += [
        ("output file", batch.output_file_id),
        ("error file", batch.error_file_id),
        ("metadata", ", ".join(f"{k}={v}" for k, v in (batch.metadata or {}).items()) or None),
    ]
    out = [f"{batch.id}  {batch.status}"]
    out += [f"  {name:<12}{value}" for name, value in rows if value]
    errors = error_lines(batch)
    if errors:
        out.append("  errors")
        out += [f"    {line}" for line in errors]
    return "\n".join(out)


def table(batches: list[Batch]) -> str:
    """The `nightbatch list` table, newest first as the API returns it."""
    header = ("ID", "STATUS", "PROGRESS", "CREATED", "ENDPOINT")
    rows = [(b.id, b.status, progress(b), ago(b.created_at), b.endpoint) for b in batches]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=False)) + "  " + r[-1]
                     for r in [header, *rows])


def show(stream: TextIO, batch: Batch | None = None, batches: list[Batch] | None = None) -> None:
    """`status` (one batch) or `list` (a table): coloured with rich on a terminal, the plain text elsewhere."""
    if not stream.isatty():
        stream.write((describe(batch) if batch is not None else table(batches or [])) + "\n")
        return
    console = Console(file=stream, highlight=False)
    if batch is not None:
        _, _, rest = describe(batch).partition("\n")
        console.print(Text(f"{batch.id}  ") + Text(batch.status, style=STATUS_STYLE.get(batch.status, "")))
        if rest:
            console.print(Text(rest))
        return
    grid = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("ID", "STATUS", "PROGRESS", "CREATED", "ENDPOINT"):
        grid.add_column(name, no_wrap=True)
    for b in batches or []:
        grid.add_row(b.id, Text(b.status, style=STATUS_STYLE.get(b.status, "")), progress(b), ago(b.created_at),
                     b.endpoint)
    console.print(grid)


def outcome(batch: Batch) -> list[str]:
    """What `submit --wait` / `status --wait` print when the batch has ended."""
    parts = [f"{batch.status} in {took(batch) or '?'}", counts(batch)]
    if batch.usage is not None:
        parts.append(f"{batch.usage.total_tokens:,} tokens")
    if cost(batch):
        parts.append(str(cost(batch)))
    lines = [f"{batch.id} " + ": ".join(parts[:2]) + "".join(f" · {p}" for p in parts[2:])]
    lines += [f"  {line}" for line in error_lines(batch)]
    if batch.output_file_id:
        lines.append(f"  results: nightbatch results {batch.id} -o results.jsonl")
    if batch.error_file_id:
        lines.append(f"  errors:  nightbatch results {batch.id} --errors -o errors.jsonl")
    return lines
