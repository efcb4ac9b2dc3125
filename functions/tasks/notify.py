"""Notify step Lambda: the batch's event to its webhook endpoints (queued), the SNS topic and email recipients."""

from __future__ import annotations

from typing import Any

from nightbatch.logs import log_context
from nightbatch.notifications import Notifier, build_notifier, notify_batch
from nightbatch.notifications.models import NotifyInput
from nightbatch.services import Services, default_services

_built: tuple[Services, Notifier] | None = None


def default_notifier() -> Notifier:
    """The process's notifier (SQS delivery queue, SNS topic, SES sender), built over `default_services()` and
    rebuilt whenever that is (tests clear its cache between environments)."""
    global _built
    services = default_services()
    if _built is None or _built[0] is not services:
        _built = (services, build_notifier(services.adapters))
    return _built[1]


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    inp = NotifyInput.model_validate(event)
    with log_context(batch_id=inp.batch_id, request_id=getattr(context, "aws_request_id", None)):
        return notify_batch(inp.batch_id, notifier=default_notifier()).model_dump()
