"""Capacity step Lambda: the queue, priority and share of a shard's next job submission."""

from __future__ import annotations

from typing import Any

from functions.tasks.tracing import annotate_batch, tracer
from nightbatch.logs import configure_logging, log_context
from nightbatch.pipeline.capacity import decide
from nightbatch.wiring import default_services

configure_logging()


@tracer.capture_lambda_handler(capture_response=False)
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    annotate_batch(event.get("batch_id"))
    with log_context(batch_id=event.get("batch_id"), request_id=getattr(context, "aws_request_id", None)):
        return decide(event, default_services()).model_dump()
