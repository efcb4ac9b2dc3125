"""Notify step Lambda: the batch's event to its webhook endpoints (queued), the SNS topic and email recipients."""

from __future__ import annotations

from typing import Any

from functions.tasks.tracing import annotate_batch, tracer
from nightbatch.logs import log_context
from nightbatch.notifications import Notifier, notify_batch
from nightbatch.notifications.objects import NotifyInput
from nightbatch.wiring import default_services


def default_notifier() -> Notifier:
    """The process's notifier (SQS delivery queue, SNS topic, SES sender), wired by nightbatch.wiring."""
    return default_services().notifier


@tracer.capture_lambda_handler(capture_response=False)
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    inp = NotifyInput.model_validate(event)
    annotate_batch(inp.batch_id)
    with log_context(batch_id=inp.batch_id, request_id=getattr(context, "aws_request_id", None)):
        return notify_batch(inp.batch_id, notifier=default_notifier()).model_dump()
