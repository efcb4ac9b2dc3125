"""SQS adapter: the upload-composition jobs the API hands to the compose-upload task function."""

from __future__ import annotations

import json
from typing import Any

# SQS delays a message by at most 15 minutes.
MAX_DELAY_SECONDS = 900


class SqsUploadJobs:
    def __init__(self, *, client: Any, queue_url: str) -> None:
        self.client = client
        self.queue_url = queue_url

    def compose(self, file_id: str, upload_id: str, *, delay_seconds: float = 0.0) -> None:
        self._send({"task": "compose_upload", "file_id": file_id, "upload_id": upload_id}, delay_seconds)

    def purge_parts(self, upload_id: str, *, delay_seconds: float = 0.0) -> None:
        self._send({"task": "purge_upload_parts", "upload_id": upload_id}, delay_seconds)

    def _send(self, body: dict[str, str], delay_seconds: float) -> None:
        self.client.send_message(
            QueueUrl=self.queue_url, MessageBody=json.dumps(body),
            DelaySeconds=max(0, min(MAX_DELAY_SECONDS, int(delay_seconds))),
        )
