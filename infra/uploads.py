"""Uploads: the queue the Uploads API hands compose/purge work to, and the Lambda that does it."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_lambda_event_sources as event_sources
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from infra.environment import settings_environment
from infra.lambdas import LambdaBase

COMPOSE_HANDLER = "functions.tasks.compose_upload.handler"
# Composing streams up to 8 GB of parts into one object.
COMPOSE_TIMEOUT = cdk.Duration.minutes(15)
COMPOSE_MAX_RECEIVES = 5


class UploadComposer(Construct):
    """SQS queue (+ DLQ) of compose/purge messages, consumed one at a time by the compose-upload Lambda.

    Both tasks are idempotent and raise on failure, so a message is simply redelivered until it lands in the DLQ.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        lambdas: LambdaBase,
    ) -> None:
        super().__init__(scope, id)
        self.dlq = sqs.Queue(self, "Dlq", encryption=sqs.QueueEncryption.SQS_MANAGED, enforce_ssl=True,
                             retention_period=cdk.Duration.days(14))
        self.queue = sqs.Queue(
            self, "Queue",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            # AWS's advice for a Lambda event source: at least six times the function's timeout.
            visibility_timeout=cdk.Duration.minutes(COMPOSE_TIMEOUT.to_minutes() * 6),
            retention_period=cdk.Duration.days(4),
            dead_letter_queue=sqs.DeadLetterQueue(queue=self.dlq, max_receive_count=COMPOSE_MAX_RECEIVES),
        )
        self.composer = lambdas.function(
            self, "Compose", handler=COMPOSE_HANDLER,
            description="nightbatch uploads: composes an Upload's parts into its file, purges parts",
            # The composer queues the delayed purge of the parts it composed.
            environment=settings_environment({"upload_queue_url": self.queue.queue_url}),
            timeout=COMPOSE_TIMEOUT, memory_mb=2048,
        )
        self.composer.function.add_event_source(event_sources.SqsEventSource(self.queue, batch_size=1))
