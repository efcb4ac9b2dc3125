"""Per-tenant usage over a period: tokens, GPU-seconds and estimated cost, summed from finished batches."""

from __future__ import annotations

from typing import Any

from nightbatch.aws import Table
from nightbatch.aws.records import BatchRecord
from nightbatch.clock import now, sort_key
from nightbatch.errors import InvalidRequestError


def tenant_usage(table: Table, tenant: str, *, start: int | None, end: int | None) -> dict[str, Any]:
    end = end if end is not None else now() + 1
    start = start if start is not None else end - 30 * 86400
    if start >= end:
        raise InvalidRequestError("'start' must be before 'end'.", param="start", code="invalid_value")
    totals: dict[str, Any] = {"batches": 0, "completed_requests": 0, "failed_requests": 0, "input_tokens": 0,
                              "output_tokens": 0, "reasoning_tokens": 0, "total_tokens": 0, "gpu_seconds": 0.0,
                              "estimated_cost_usd": 0.0}
    by_status: dict[str, int] = {}
    # Newest first from `end` back to `start`: the owner index is ordered by creation time.
    for batch in table.records(BatchRecord, BatchRecord.owner_of(tenant), ascending=False,
                               after_sk=sort_key(end, "")):
        if batch.created_at < start:
            break
        totals["batches"] += 1
        by_status[batch.status] = by_status.get(batch.status, 0) + 1
        counts = batch.request_counts or {}
        totals["completed_requests"] += int(counts.get("completed", 0))
        totals["failed_requests"] += int(counts.get("failed", 0))
        usage = batch.usage or {}
        for k in ("input_tokens", "output_tokens", "total_tokens"):
            totals[k] += int(usage.get(k, 0))
        # Part of output_tokens (and so of the cost), as in OpenAI's usage objects.
        totals["reasoning_tokens"] += int((usage.get("output_tokens_details") or {}).get("reasoning_tokens", 0))
        cost = (batch.ext or {}).get("cost") or {}
        totals["gpu_seconds"] += float(cost.get("gpu_seconds", 0.0))
        totals["estimated_cost_usd"] += float(cost.get("estimated_cost_usd", 0.0))
    totals["gpu_seconds"] = round(totals["gpu_seconds"], 3)
    totals["estimated_cost_usd"] = round(totals["estimated_cost_usd"], 6)
    return {"object": "nightbatch.usage", "tenant": tenant, "start": start, "end": end, "by_status": by_status,
            **totals}
