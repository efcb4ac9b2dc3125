"""SQS adapter for webhook deliveries: messages delayed up to SQS's 15-minute cap (the consumer re-queues
messages that arrive before their `not_before`, so longer backoffs take several hops)."""

from __future__ import annotations

import json
import math
from typing import Any

from nightbatch.aws.sqs import MAX_DELAY_SECONDS


class SqsDeliveryQueue:
    def __init__(self, *, client: Any, queue_url: str) -> None:
        self.client = client
        self.queue_url = queue_url

    def send(self, message: dict[str, Any], delay_seconds: float) -> None:
        delay = min(MAX_DELAY_SECONDS, max(0, math.ceil(delay_seconds)))
        self.client.send_message(QueueUrl=self.queue_url, MessageBody=json.dumps(message), DelaySeconds=delay)

    def close(self) -> None:
        """Nothing to release: the messages live in SQS."""
