"""Batch e-mails: the summary text. Who may receive them (opt-in per batch, limited to allowed domains) is
nightbatch/batches/recipients.py, checked at create and again here at send."""

from __future__ import annotations

from datetime import UTC, datetime

from nightbatch.wire import Batch


def _when(ts: int | None) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if ts else "-"


def _duration(seconds: int) -> str:
    h, rem = divmod(max(0, seconds), 3600)
    m, s = divmod(rem, 60)
    return f"{h}h {m:02d}m {s:02d}s" if h else f"{m}m {s:02d}s"


def compose(batch: Batch, links: dict[str, str | None], *, links_expire_at: int | None) -> tuple[str, str]:
    """(subject, plain text): status, counts, usage, duration and download links."""
    counts = batch.request_counts
    ended = getattr(batch, f"{batch.status}_at", None) or batch.created_at
    subject = f"[nightbatch] Batch {batch.id} {batch.status}"
    if counts.total:
        subject += f" ({counts.completed}/{counts.total} succeeded)"
    lines = [
        f"Batch {batch.id} is {batch.status}.",
        "",
        f"Status:    {batch.status}",
        f"Endpoint:  {batch.endpoint}" + (f"   Model: {batch.model}" if batch.model else ""),
        f"Requests:  {counts.total} total, {counts.completed} completed, {counts.failed} failed",
    ]
    if batch.usage is not None:
        u = batch.usage
        lines.append(f"Tokens:    {u.input_tokens} input, {u.output_tokens} output, {u.total_tokens} total")
    cost = (batch.nightbatch or {}).get("cost") or {}
    if cost:
        per_m = cost.get("usd_per_1m_output_tokens")
        lines.append(f"GPU time:  {cost.get('gpu_seconds', 0):.0f} GPU-seconds on {cost.get('instance_type')} "
                     f"({cost.get('capacity')}), {100 * float(cost.get('load_share') or 0):.0f}% loading the model")
        lines.append(f"Cost:      ~${float(cost.get('estimated_cost_usd') or 0):.4f} (estimate)"
                     + (f", ${per_m:.4f} per 1M output tokens" if per_m else ""))
    lines.append(f"Duration:  {_duration(ended - batch.created_at)} "
                 f"(created {_when(batch.created_at)}, {batch.status} {_when(ended)})")
    if batch.metadata:
        lines.append("Metadata:  " + ", ".join(f"{k}={v}" for k, v in sorted(batch.metadata.items())))
    if batch.errors and batch.errors.data:
        lines += ["", "Errors:"]
        for e in batch.errors.data[:5]:
            where = f"line {e.line}: " if e.line else ""
            lines.append(f"  - {where}{e.code}: {e.message}")
        if len(batch.errors.data) > 5:
            lines.append(f"  ... and {len(batch.errors.data) - 5} more")
    files = [(label, fid) for label, fid in (("Output file", batch.output_file_id),
                                              ("Error file", batch.error_file_id)) if fid]
    if files:
        lines += ["", "Downloads" + (f" (links valid until {_when(links_expire_at)}):" if links_expire_at else ":")]
        for label, fid in files:
            link = links.get(fid)
            lines.append(f"  {label} {fid}: {link}" if link else f"  {label}: {fid}")
    lines += ["", f'With the OpenAI SDK: client.batches.retrieve("{batch.id}")', ""]
    return subject, "\n".join(lines)
