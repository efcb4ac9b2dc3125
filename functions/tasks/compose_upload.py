"""Compose-upload task: messages from the Uploads API (SQS, or an async invoke) → one S3 object per file.

Messages: {"task": "compose_upload", "file_id", "upload_id"} and {"task": "purge_upload_parts", "upload_id"}.
Both are idempotent, so a failure raises and the queue redelivers the whole batch.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

from functions.tasks.tracing import tracer
from nightbatch.wiring import Services, default_services

log = logging.getLogger("nightbatch.tasks.compose_upload")

TASKS: dict[str, Callable[[Services, dict[str, Any]], object]] = {
    "compose_upload": lambda s, m: s.assembly.compose(m["file_id"], m["upload_id"]),
    "purge_upload_parts": lambda s, m: s.assembly.purge(m["upload_id"]),
}


def messages(event: dict[str, Any]) -> Iterator[dict[str, Any]]:
    if "Records" in event:
        for record in event["Records"]:
            yield json.loads(record["body"])
    else:
        yield event


def run(services: Services, event: dict[str, Any]) -> list[object]:
    results: list[object] = []
    for message in messages(event):
        task = TASKS.get(str(message.get("task")))
        if task is None:
            log.error("unknown upload task dropped: %s", message)  # redelivery cannot fix it
            continue
        results.append(task(services, message))
    return results


@tracer.capture_lambda_handler(capture_response=False)
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return {"results": [str(r) for r in run(default_services(), event)]}
