"""SNS adapter: publishes one notification to the stack's topic, with string message attributes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class Topic:
    def __init__(self, *, client: Any, topic_arn: str) -> None:
        self.client = client
        self.topic_arn = topic_arn

    def publish(self, message: str, *, subject: str, attributes: Mapping[str, str]) -> str:
        resp = self.client.publish(
            TopicArn=self.topic_arn, Message=message, Subject=subject[:100],
            MessageAttributes={k: {"DataType": "String", "StringValue": v} for k, v in attributes.items() if v},
        )
        return str(resp["MessageId"])
