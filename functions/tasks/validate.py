"""Validate step Lambda."""

from __future__ import annotations

from typing import Any

from functions.tasks import run_batch_task
from functions.tasks.tracing import tracer
from nightbatch.pipeline import validate_batch


@tracer.capture_lambda_handler(capture_response=False)
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return run_batch_task(validate_batch, event, context)
