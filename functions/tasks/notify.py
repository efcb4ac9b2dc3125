"""Notify step Lambda: the batch's event to its webhook endpoints (queued), the SNS topic and email recipients."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from nightbatch.notifications import Notifier, build_notifier, notify_batch
from nightbatch.notifications.models import NotifyInput
from nightbatch.settings import get_settings
from nightbatch.storage import make_adapters


@lru_cache(maxsize=1)
def default_notifier() -> Notifier:
    return build_notifier(make_adapters(get_settings()))


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    inp = NotifyInput.model_validate(event)
    return notify_batch(inp.batch_id, notifier=default_notifier()).model_dump()
