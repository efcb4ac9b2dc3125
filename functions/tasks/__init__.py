"""One Lambda handler per workflow step; each parses its versioned input and calls the core task function."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from functions.tasks.tracing import annotate_batch
from nightbatch.logs import configure_logging, log_context
from nightbatch.pipeline import BatchTaskInput
from nightbatch.wiring import Services, default_services

configure_logging()


def run_batch_task(fn: Callable[[BatchTaskInput, Services], BaseModel], event: dict[str, Any],
                   context: Any) -> dict[str, Any]:
    """Every log line of the step carries the batch id and the Lambda request id (structured JSON logs); the
    X-Ray subsegment of the handler carries the batch id too."""
    inp = BatchTaskInput.model_validate(event)
    annotate_batch(inp.batch_id)
    with log_context(batch_id=inp.batch_id, request_id=getattr(context, "aws_request_id", None)):
        return fn(inp, default_services()).model_dump()
