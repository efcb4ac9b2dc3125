"""The Batch object a batch record shows: live counts and tokens while it runs, the final ones after.

Below both the batches use cases and the notifier (which sends this object in events), so neither imports the other.
"""

from __future__ import annotations

import math
from typing import Any

from nightbatch.aws.records import BatchRecord
from nightbatch.clock import now
from nightbatch.wire import Batch, BatchErrors, RequestCounts, Usage


def to_wire(rec: BatchRecord) -> Batch:
    counts = rec.request_counts
    ext = dict(rec.ext or {})
    if rec.backend_moved:  # Capacity moved its remaining shards (nightbatch/pipeline/capacity.py)
        ext["backend_moved"] = {"to": rec.backend_moved_to or "sagemaker", "reason": rec.backend_moved}
    if rec.status in ("in_progress", "cancelling", "finalizing"):
        # Live progress: atomic adds from the workers (final numbers come from the files at finalize).
        total = counts.get("total", 0)
        counts = {"total": total, "completed": min(rec.live_completed or 0, total),
                  "failed": min(rec.live_failed or 0, total)}
        if rec.live_input_tokens is not None or rec.live_output_tokens is not None:
            # Tokens so far, for tokens/s in the CLI and the dashboard; `usage` stays final-only.
            live_in, live_out = rec.live_input_tokens or 0, rec.live_output_tokens or 0
            ext["live_usage"] = {"input_tokens": live_in, "output_tokens": live_out,
                                 "total_tokens": live_in + live_out}
        finish = estimated_finish(rec, counts)
        if finish is not None:
            ext["estimated_finish_at"] = finish
    return Batch(
        id=rec.pk, endpoint=rec.endpoint, model=rec.model,
        errors=BatchErrors.model_validate(rec.errors) if rec.errors else None,
        input_file_id=rec.input_file_id, completion_window=rec.completion_window, status=rec.status,
        output_file_id=rec.output_file_id, error_file_id=rec.error_file_id, created_at=rec.created_at,
        in_progress_at=rec.in_progress_at, expires_at=rec.expires_at, finalizing_at=rec.finalizing_at,
        completed_at=rec.completed_at, failed_at=rec.failed_at, expired_at=rec.expired_at,
        cancelling_at=rec.cancelling_at, cancelled_at=rec.cancelled_at,
        request_counts=RequestCounts.model_validate(counts),
        usage=Usage.model_validate(rec.usage) if rec.usage else None,
        metadata=rec.metadata, nightbatch=_with_cache_rate(ext, rec.usage) or None,
    )


def estimated_finish(rec: BatchRecord, counts: dict[str, int]) -> int | None:
    """When a running batch should end at its average pace since its first shard began: unix seconds, None
    before any line is done (or once it is not `in_progress`)."""
    done = counts.get("completed", 0) + counts.get("failed", 0)
    total = counts.get("total", 0)
    if rec.status != "in_progress" or not rec.live_since or done <= 0 or total <= done:
        return None
    t = now()
    rate = done / max(1, t - rec.live_since)
    return t + math.ceil((total - done) / rate)


def _with_cache_rate(ext: dict[str, Any], usage: dict[str, Any] | None) -> dict[str, Any]:
    """The prompt-cache hit rate of a finished batch: prefix-cached prompt tokens / prompt tokens (what prefix-
    aware placement exists to raise; 0 where the engine reports no cached tokens)."""
    prompt = int((usage or {}).get("input_tokens") or 0)
    if prompt > 0:
        cached = int(((usage or {}).get("input_tokens_details") or {}).get("cached_tokens") or 0)
        ext["prompt_cache_hit_rate"] = round(cached / prompt, 4)
    return ext
