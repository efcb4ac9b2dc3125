"""Notify step Lambda: the batch's event to its webhook endpoints (queued), the SNS topic and email recipients."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from nightbatch.notifications import Notifier, build_notifier, notify_batch
from nightbatch.notifications.models import NotifyInput
from nightbatch.services import default_services


@lru_cache(maxsize=1)
def default_notifier() -> Notifier:
    """The notifier of a Lambda process: SQS delivery queue, SNS topic and SES sender from the environment."""
    return build_notifier(default_services().adapters)


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    inp = NotifyInput.model_validate(event)
    return notify_batch(inp.batch_id, notifier=default_notifier()).model_dump()
