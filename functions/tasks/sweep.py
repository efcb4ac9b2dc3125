"""Sweeper Lambda (scheduled): re-drives stuck batches and Notify events whose channels are still pending."""

from __future__ import annotations

from typing import Any

from functions.tasks.tracing import tracer
from nightbatch.aws.functions import AsyncInvoker
from nightbatch.pipeline.sweep import sweep
from nightbatch.wiring import default_services


@tracer.capture_lambda_handler(capture_response=False)
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    services = default_services()
    name = services.settings.notifications.notify_function
    notify = None
    if name:
        invoker = AsyncInvoker(client=services.adapters.client("lambda"), function_name=name)

        def notify(batch_id: str) -> None:
            invoker.invoke({"version": 1, "batch_id": batch_id})

    return sweep(services, notify=notify)
