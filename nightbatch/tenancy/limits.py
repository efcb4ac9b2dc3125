"""Per-tenant limits: queued requests and tokens (checked in Validate); batches in flight, request rate (429).

State lives in the one table:
- `usage#<tenant>`: running totals (`queued_requests`, `queued_tokens`, `batches_in_flight`) plus one
  member per batch that added to them (`q#<batch_id>` from Validate, `f#<batch_id>` from create), so adding
  and taking back are idempotent per batch (aws/quota.py).
- `rate#<tenant>#<minute>`: a fixed one-minute window counter with a TTL.

A batch that reaches a terminal status must give back what it holds: `release_queue_usage` does both members.
If a release is ever missed, the next check that would trip reconciles the members against the batches'
statuses first, so a lost release costs one extra read rather than a permanently full quota.
"""

from __future__ import annotations

import math
import time
from typing import Any

from pydantic import BaseModel

from nightbatch.aws import Table, quota
from nightbatch.aws.records import BatchRecord, FileRecord, RateCounter, UploadRecord, UsageCounters
from nightbatch.clock import now
from nightbatch.errors import InvalidRequestError, RateLimitError, StorageConflictError
from nightbatch.settings import Settings, TenantLimits
from nightbatch.wire import TERMINAL_STATUSES, BatchError

QUEUE_MEMBER = "q#"
FLIGHT_MEMBER = "f#"
# A create reserves its slot just before it writes the batch; younger reservations without a batch are kept.
ORPHAN_GRACE_SECONDS = 120
WINDOW_SECONDS = 60


class TenantUsage(BaseModel):
    queued_requests: int = 0
    queued_tokens: int = 0
    batches_in_flight: int = 0
    requests_this_minute: int = 0
    stored_bytes: int = 0


def limits_for(settings: Settings, tenant: str) -> TenantLimits:
    base = {
        "queued_requests": settings.limits.queued_requests,
        "queued_tokens": settings.limits.queued_tokens,
        "batches_in_flight": settings.limits.batches_in_flight,
        "requests_per_minute": settings.limits.requests_per_minute,
        "stored_bytes": settings.limits.stored_bytes,
    }
    overrides = settings.limits.tenant_overrides
    base.update(overrides.get(tenant, overrides.get("*", {})))
    return TenantLimits.model_validate(base)


def usage_pk(tenant: str) -> str:
    return UsageCounters.pk_of(tenant)


def _usage_fields(tenant: str) -> dict[str, Any]:
    return UsageCounters.identity(tenant)


def check_queue_limits(
    table: Table, tenant: str, batch_id: str, requests: int, est_tokens: int,
    *, settings: Settings, model: str | None = None,
) -> BatchError | None:
    """Reserves this batch's requests and estimated tokens in the tenant's queue, or says why it cannot.

    Called by Validate once the input is known to be good. Idempotent per batch: a re-run Validate does not
    count the batch twice. The BatchError (code `token_limit_exceeded`, OpenAI's) carries the numbers.
    """
    lim = limits_for(settings, tenant)
    amounts = {"queued_requests": requests, "queued_tokens": est_tokens}
    caps = {"queued_requests": lim.queued_requests, "queued_tokens": lim.queued_tokens}
    member = QUEUE_MEMBER + batch_id
    entry = {"at": now()}
    pk = usage_pk(tenant)
    if quota.reserve(table, pk, member, amounts, caps, entry=entry, fields=_usage_fields(tenant)):
        return None
    reconcile_usage(table, tenant)
    if quota.reserve(table, pk, member, amounts, caps, entry=entry, fields=_usage_fields(tenant)):
        return None
    used = read_usage(table, tenant)
    what = model or "this deployment"
    if lim.queued_tokens and used.queued_tokens + est_tokens > lim.queued_tokens:
        message = (
            f"Enqueued token limit reached for {what} in tenant '{tenant}'. Limit: {lim.queued_tokens:,} "
            f"enqueued tokens. Already enqueued by unfinished batches: {used.queued_tokens:,}; this batch "
            f"needs about {est_tokens:,}. Please try again once some in_progress batches have been completed."
        )
    else:
        message = (
            f"Enqueued request limit reached for {what} in tenant '{tenant}'. Limit: "
            f"{lim.queued_requests:,} enqueued requests. Already enqueued by unfinished batches: "
            f"{used.queued_requests:,}; this batch has {requests:,}. Please try again once some in_progress "
            "batches have been completed."
        )
    return BatchError(code="token_limit_exceeded", message=message)


def release_queue_usage(table: Table, tenant: str, batch_id: str) -> None:
    """Gives back what a batch holds (queued requests/tokens and its in-flight slot). Safe to call twice.

    Call it when a batch reaches any terminal status: completed, expired, cancelled, or failed.
    """
    quota.release_all(table, usage_pk(tenant), (QUEUE_MEMBER + batch_id, FLIGHT_MEMBER + batch_id))


def admit_batch(table: Table, tenant: str, batch_id: str, *, settings: Settings) -> None:
    """Takes an in-flight slot for a batch about to be created; 429 when the tenant has none left."""
    lim = limits_for(settings, tenant)
    pk = usage_pk(tenant)
    member = FLIGHT_MEMBER + batch_id
    args = ({"batches_in_flight": 1}, {"batches_in_flight": lim.batches_in_flight})
    entry = {"at": now()}
    if quota.reserve(table, pk, member, *args, entry=entry, fields=_usage_fields(tenant)):
        return
    reconcile_usage(table, tenant)
    if quota.reserve(table, pk, member, *args, entry=entry, fields=_usage_fields(tenant)):
        return
    used = read_usage(table, tenant).batches_in_flight
    raise RateLimitError(
        f"Too many batches in flight for tenant '{tenant}': {used} unfinished batches, limit "
        f"{lim.batches_in_flight}. Wait for a batch to finish (or cancel one), then try again.",
        headers={"retry-after": str(max(1, min(60, settings.limits.in_flight_retry_after)))},
    )


def release_batch_slot(table: Table, tenant: str, batch_id: str) -> None:
    """Undoes `admit_batch` when the create did not happen after all."""
    quota.release(table, usage_pk(tenant), FLIGHT_MEMBER + batch_id)


def batches_in_flight(table: Table, tenant: str) -> list[str]:
    """The ids of the tenant's batches holding an in-flight slot: every batch created and not yet ended."""
    counters = table.get_record(UsageCounters, usage_pk(tenant))
    members = quota.members(counters.model_extra or {}, FLIGHT_MEMBER) if counters is not None else {}
    return [m[len(FLIGHT_MEMBER):] for m in members]


def reconcile_usage(table: Table, tenant: str) -> int:
    """Releases members whose batch is terminal, another tenant's, or long missing. Returns how many."""
    counters = table.get_record(UsageCounters, usage_pk(tenant))
    if counters is None:
        return 0
    released = 0
    t = now()
    for prefix in (QUEUE_MEMBER, FLIGHT_MEMBER):
        for member, entry in quota.members(counters.model_extra or {}, prefix).items():
            batch = table.get_owned(BatchRecord, tenant, member[len(prefix):])
            if batch is None:
                stale = t - int(entry.get("at", 0)) > ORPHAN_GRACE_SECONDS
            else:
                stale = batch.status in TERMINAL_STATUSES
            if stale and quota.release(table, usage_pk(tenant), member):
                released += 1
    return released


def read_usage(table: Table, tenant: str) -> TenantUsage:
    usage = table.get_record(UsageCounters, usage_pk(tenant)) or UsageCounters(pk=usage_pk(tenant), tenant=tenant)
    rate = table.get_record(RateCounter, _rate_pk(tenant, _window(time.time())))
    return TenantUsage(
        queued_requests=max(0, usage.queued_requests), queued_tokens=max(0, usage.queued_tokens),
        batches_in_flight=max(0, usage.batches_in_flight), requests_this_minute=rate.requests if rate else 0,
        stored_bytes=max(0, usage.stored_bytes),
    )


def _window(t: float) -> int:
    return int(t // WINDOW_SECONDS) * WINDOW_SECONDS


def _rate_pk(tenant: str, window: int) -> str:
    return RateCounter.pk_of(tenant, window)


def count_request(table: Table, tenant: str, *, settings: Settings) -> None:
    """Counts one API request in the tenant's current minute; 429 with Retry-After once over the limit."""
    limit = limits_for(settings, tenant).requests_per_minute
    if limit <= 0:
        return
    t = time.time()
    window = _window(t)
    used = table.update_record(
        RateCounter, _rate_pk(tenant, window), add={"requests": 1},
        set_={**RateCounter.identity(tenant), "ttl": window + 2 * WINDOW_SECONDS}, must_exist=False,
    ).requests
    if used > limit:
        wait = max(1, math.ceil(window + WINDOW_SECONDS - t))
        raise RateLimitError(
            f"Rate limit reached for requests in tenant '{tenant}': Limit {limit} / min, Used {used}. "
            f"Please try again in {wait}s.",
            headers={"retry-after": str(wait)},
        )


# --- Stored bytes: what a tenant's uploaded files and open Uploads hold in S3 (batch outputs are not counted:
# they derive from inputs that were). The item counted carries `quota_bytes`; the total is a plain counter,
# recounted from those items whenever it would refuse, so a missed release (an item gone by TTL) heals itself.

QUOTA_ATTR = "quota_bytes"


def reserve_storage(table: Table, tenant: str, amount: int, *, settings: Settings) -> None:
    """Adds `amount` to the tenant's stored bytes, or 400 `storage_quota_exceeded` past `stored_bytes`."""
    cap = limits_for(settings, tenant).stored_bytes
    for attempt in range(2 if not cap or amount <= cap else 0):
        try:
            table.update_attributes(UsageCounters, usage_pk(tenant), add={"stored_bytes": amount},
                                    set_=_usage_fields(tenant),
                                    expect_at_most={"stored_bytes": cap - amount} if cap else None, must_exist=False)
            return
        except StorageConflictError:
            if attempt == 0:
                recount_storage(table, tenant)
    used = read_usage(table, tenant).stored_bytes
    raise InvalidRequestError(
        f"Storage limit reached for tenant '{tenant}': {used:,} of {cap:,} bytes are held by files and open "
        f"Uploads; this needs {amount:,} more. Delete files you no longer need, then try again.",
        code="storage_quota_exceeded")


def release_storage(table: Table, tenant: str, amount: int) -> None:
    if amount:
        table.update_attributes(UsageCounters, usage_pk(tenant), add={"stored_bytes": -amount}, must_exist=False)


def recount_storage(table: Table, tenant: str) -> int:
    """Sets the counter to what the tenant's live files and pending Uploads hold; returns it."""
    t = now()
    total = 0
    for file in table.records(FileRecord, FileRecord.owner_of(tenant), ascending=True, page_size=1000):
        if file.live(t):
            total += file.quota_bytes
    for upload in table.records(UploadRecord, UploadRecord.owner_of(tenant), ascending=True, page_size=1000):
        if upload.status == "pending" and upload.expires_at > t:
            total += upload.quota_bytes
    table.update_attributes(UsageCounters, usage_pk(tenant), set_={"stored_bytes": total, **_usage_fields(tenant)},
                            must_exist=False)
    return total
