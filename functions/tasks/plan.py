"""Plan step Lambda."""

from __future__ import annotations

from typing import Any

from functions.tasks import run_batch_task
from functions.tasks.tracing import tracer
from nightbatch.pipeline import plan_batch


@tracer.capture_lambda_handler(capture_response=False)
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return run_batch_task(plan_batch, event, context)
