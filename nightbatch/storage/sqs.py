"""SQS adapter: the queue of pending webhook deliveries (AWS), delays capped at SQS's 15 minutes."""

from __future__ import annotations

import json
import math
from typing import Any

# SQS refuses DelaySeconds above 900; longer waits are re-enqueued by the consumer (see notifications.delivery).
MAX_DELAY_SECONDS = 900


class SqsQueue:
    def __init__(self, *, client: Any, queue_url: str) -> None:
        self.client = client
        self.queue_url = queue_url

    def send(self, message: dict[str, Any], delay_seconds: float) -> None:
        delay = min(MAX_DELAY_SECONDS, max(0, math.ceil(delay_seconds)))
        self.client.send_message(QueueUrl=self.queue_url, MessageBody=json.dumps(message), DelaySeconds=delay)

    def close(self) -> None:
        """Nothing to release: messages live in SQS."""
