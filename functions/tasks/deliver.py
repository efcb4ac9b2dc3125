"""Webhook delivery Lambda (SQS-triggered): one attempt per message; failures are re-queued with backoff.

Returns `batchItemFailures` (the event source mapping reports batch item failures), so one crashing message is
redelivered by SQS and, past maxReceiveCount, lands in the DLQ, without repeating the others of its batch.
Powertools' batch processor does the bookkeeping.
"""

from __future__ import annotations

import json
from typing import Any

from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from functions.tasks.notify import default_notifier
from functions.tasks.tracing import tracer

# A batch whose every message failed is reported as such too (not raised): SQS redelivers exactly those.
processor = BatchProcessor(event_type=EventType.SQS, raise_on_entire_batch_failure=False)


def _deliver(record: SQSRecord) -> None:
    default_notifier().handle_message(json.loads(record.body))


@tracer.capture_lambda_handler(capture_response=False)
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return dict(process_partial_response(event=event, record_handler=_deliver, processor=processor, context=context))
