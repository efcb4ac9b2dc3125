"""Batch emails: who may receive them (opt-in per batch, limited to allowed domains) and the summary text."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from nightbatch.errors import InvalidRequestError
from nightbatch.settings import Settings
from nightbatch.wire import Batch

MAX_BATCH_RECIPIENTS = 10
ADDRESS_RE = re.compile(r"^[A-Za-z0-9.!#$%&*+/=?^_`{|}~-]+@([A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
                        r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)+)$")
PARAM = "nightbatch.notify.email"


def _split(csv: str) -> list[str]:
    return [x.strip() for x in csv.split(",") if x.strip()]


def requested(options: dict[str, Any] | None) -> list[str]:
    """The addresses a batch asked for: `extra_body={"nightbatch": {"notify": {"email": "a@x" | [...]}}}`."""
    notify = (options or {}).get("notify") or {}
    value = notify.get("email") if isinstance(notify, dict) else None
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value) if isinstance(value, list) else [value]


def domain_allowed(settings: Settings, address: str) -> bool:
    """NIGHTBATCH_EMAIL_ALLOWED_DOMAINS: "*" allows any domain; empty allows none in AWS, where anyone holding
    an API key could otherwise make the deployment's SES identity mail anywhere, and any in the local mode,
    whose SES is the embedded emulation that sends nothing."""
    domains = {d.lower() for d in _split(settings.notifications.email_allowed_domains)}
    m = ADDRESS_RE.fullmatch(address)
    if m is None:
        return False
    if not domains:
        return settings.deployment.mode == "local"
    return "*" in domains or m.group(1).lower() in domains


def check_notify_options(options: dict[str, Any] | None, settings: Settings) -> None:
    """For batch create: a clear 400 now rather than a silently dropped email later."""
    addresses = requested(options)
    if len(addresses) > MAX_BATCH_RECIPIENTS:
        raise InvalidRequestError(f"Invalid '{PARAM}': at most {MAX_BATCH_RECIPIENTS} addresses.", param=PARAM,
                                  code="invalid_value")
    for a in addresses:
        if not isinstance(a, str) or not ADDRESS_RE.fullmatch(a):
            raise InvalidRequestError(f"Invalid '{PARAM}': {a!r} is not an email address.", param=PARAM,
                                      code="invalid_value")
        if not domain_allowed(settings, a):
            raise InvalidRequestError(
                f"Invalid '{PARAM}': '{a}' is not in a domain this deployment may email "
                "(NIGHTBATCH_EMAIL_ALLOWED_DOMAINS).", param=PARAM, code="invalid_value")


def recipients(settings: Settings, options: dict[str, Any] | None) -> tuple[list[str], list[str]]:
    """(to send to, refused): the operator's recipients, then the batch's own that pass the domain rule."""
    out: list[str] = []
    refused: list[str] = []
    for a in _split(settings.notifications.email_recipients):
        if a.lower() not in (x.lower() for x in out):
            out.append(a)
    for a in requested(options)[:MAX_BATCH_RECIPIENTS]:
        if not isinstance(a, str) or not domain_allowed(settings, a):
            refused.append(str(a))
        elif a.lower() not in (x.lower() for x in out):
            out.append(a)
    return out, refused


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
