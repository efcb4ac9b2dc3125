"""Webhook delivery Lambda (SQS-triggered): one attempt per message; failures are re-queued with backoff.

Returns `batchItemFailures` (the event source mapping reports batch item failures), so one crashing message is
redelivered by SQS and, past maxReceiveCount, lands in the DLQ, without repeating the others of its batch.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from functions.tasks.notify import default_notifier

log = logging.getLogger("nightbatch.deliver")


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    notifier = default_notifier()
    failures: list[dict[str, str]] = []
    for record in event.get("Records", []):
        try:
            notifier.handle_message(json.loads(record["body"]))
        except Exception:
            log.exception("delivery message %s failed", record.get("messageId"))
            failures.append({"itemIdentifier": record["messageId"]})
    return {"batchItemFailures": failures}
