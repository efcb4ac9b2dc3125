"""A batch's dry run: validate an input file without creating a batch, and say what running it would take.

Tokens are the same approximation Validate uses to size shards (about four bytes of request line per prompt
token; output = each request's max_tokens, else the default), so the numbers match the shard plan the batch
would get. GPU-seconds and wall time come from `sizing.py`, as Plan sizes its shards; prices from the configured
instance type (`nightbatch/batches/cost.py`).
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel

from nightbatch.aws.records import BatchRecord
from nightbatch.batches.cost import PRICES
from nightbatch.batches.request import window_hours
from nightbatch.errors import check_supported
from nightbatch.models.spec import ENDPOINTS, SCORE_ENDPOINTS
from nightbatch.pipeline.sizing import plan_shards, wall_seconds
from nightbatch.validation.invalid import LineInvalid
from nightbatch.validation.lines import Validator, line_error
from nightbatch.validation.requests import estimate_tokens
from nightbatch.wiring import Services

OPEN_WORK_STATUSES = ("validating", "in_progress")


class EstimateRequest(BaseModel):
    input_file_id: str
    endpoint: str
    completion_window: str = "24h"


def _queue_ahead_seconds(services: Services) -> float:
    """Wall seconds the GPUs need for the batches already open (their estimated tokens), all tenants."""
    table, settings = services.adapters.table, services.settings
    tokens = 0
    for status in OPEN_WORK_STATUSES:
        for batch_id in table.open_ids(status):
            batch = table.get_record(BatchRecord, batch_id, consistent=False)
            if batch is not None and batch.status == status:
                tokens += batch.est_tokens or 0
    if not tokens:
        return 0.0
    work = tokens / max(1e-9, settings.pipeline.shard_tokens_per_second)
    return wall_seconds(work, settings.pipeline.max_gpus, settings.pipeline.max_gpus, 0.0)


def estimate(services: Services, tenant: str, req: EstimateRequest) -> dict[str, Any]:
    settings = services.settings
    check_supported(req.endpoint, ENDPOINTS, param="endpoint")  # a create's endpoints (batches/request.py)
    hours = window_hours(req.completion_window, settings.validation.max_completion_window_hours)
    item = services.files.item(tenant, req.input_file_id)  # 404 for another tenant's file, like every endpoint
    validator = Validator(settings=settings, endpoint=req.endpoint, file_images=services.files.images(tenant))
    errors: list[dict[str, Any]] = []
    requests = input_tokens = output_tokens = 0
    for raw in services.files.lines(item, max_bytes=settings.validation.max_line_bytes, read_ahead=True):
        if raw.data is not None and not raw.data.strip():
            continue
        try:
            valid = validator.check(raw.number, raw.data, raw.size)
        except LineInvalid as e:
            if len(errors) < settings.validation.max_reported_errors:
                errors.append(line_error(raw.number, e).model_dump())
            continue
        requests += 1
        # A scoring line's whole estimate is input: a cross-encoder reads the query again with each document.
        prompt = valid.est_tokens if req.endpoint in SCORE_ENDPOINTS else estimate_tokens(len(valid.raw))
        input_tokens += prompt
        output_tokens += valid.est_tokens - prompt
    if requests > settings.validation.max_requests_per_batch:
        errors.append({"code": "too_many_requests", "line": None, "param": None, "message":
                       f"The file has {requests} requests, over the limit of "
                       f"{settings.validation.max_requests_per_batch}."})
    total = input_tokens + output_tokens
    window_seconds = hours * settings.validation.hour_seconds
    segments = max(1, math.ceil(requests / max(1, settings.pipeline.segment_max_lines)))
    plan = plan_shards(total, segments, settings, window_seconds)
    gpus_per_instance = max(1, settings.accounting.gpus_per_instance)
    prices = PRICES.get(settings.accounting.instance_type, {})
    cost = {capacity: round(plan.gpu_seconds * prices.get(capacity, 0.0) / 3600 / gpus_per_instance, 6)
            for capacity in ("spot", "on-demand")}
    if settings.accounting.instance_price_per_hour:
        cost[settings.accounting.capacity] = round(plan.gpu_seconds * settings.accounting.instance_price_per_hour / 3600
                                        / gpus_per_instance, 6)
    ahead = _queue_ahead_seconds(services)
    return {
        "object": "nightbatch.estimate",
        "input_file_id": req.input_file_id,
        "endpoint": req.endpoint,
        "model": validator.model,
        "completion_window": req.completion_window,
        "valid": not errors and requests > 0,
        "errors": errors if requests else [*errors, {"code": "empty_file", "line": None, "param": None,
                                                      "message": "The input file has no requests."}],
        "requests": requests,
        "input_tokens": input_tokens,
        "expected_output_tokens": output_tokens,
        "token_method": "approximate: request bytes / 4 for input; max_tokens (else the default) for output",
        "gpu_seconds": round(plan.gpu_seconds, 3),
        "instance_type": settings.accounting.instance_type,
        "cost_usd": cost,
        "usd_per_1m_tokens": {k: round(v / total * 1e6, 6) if total else None for k, v in cost.items()},
        "shard_plan": plan.as_dict(),
        "queue_ahead_seconds": round(ahead, 3),
        "window_feasible": ahead + plan.wall_seconds <= window_seconds,
        "estimate": True,
    }
