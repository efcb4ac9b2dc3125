"""The one wiring place: every adapter and service a caller (API, task Lambdas, worker, local stack) is handed.

Modules below this one take their adapters as arguments and never choose one; the choices (Step Functions or
the local workflow, SQS or a thread for upload composition, SQS or an in-process queue for webhook
deliveries, SNS and SES when configured) are made here, from the settings.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import cached_property, lru_cache

from nightbatch.aws import Adapters, make_adapters
from nightbatch.aws.delivery_queue import SqsDeliveryQueue
from nightbatch.aws.kms import KmsSealer
from nightbatch.aws.parts import PartStore
from nightbatch.aws.ses import Mailer
from nightbatch.aws.sns import Topic
from nightbatch.aws.sqs import SqsUploadJobs
from nightbatch.aws.stepfunctions import StepFunctionsWorkflow
from nightbatch.batches.service import BatchService, Workflow
from nightbatch.files.assembly import AssemblyService, ThreadUploadJobs, UploadJobs
from nightbatch.files.service import FileService
from nightbatch.files.uploads import UploadService
from nightbatch.notifications import Notifier, transport
from nightbatch.notifications.delivery import Deliveries, Poster
from nightbatch.notifications.endpoints import PlainSealer, Sealer, WebhookEndpointService
from nightbatch.notifications.queues import DeliveryQueue, InProcessQueue
from nightbatch.notifications.state_changes import StateChanges
from nightbatch.notifications.targets import Resolver
from nightbatch.settings import Settings, get_settings

log = logging.getLogger("nightbatch.services")


@dataclass
class Services:
    settings: Settings
    adapters: Adapters
    files: FileService
    batches: BatchService
    uploads: UploadService
    assembly: AssemblyService

    @cached_property
    def notifier(self) -> Notifier:
        """Built on first use: only the Notify and delivery steps and webhook CRUD need its clients (SQS, SES,
        SNS, KMS), so a request that needs none of them creates none."""
        return build_notifier(self.adapters)


def build_services(
    adapters: Adapters, workflow: Workflow | None = None, upload_jobs: UploadJobs | None = None
) -> Services:
    settings = adapters.settings
    if workflow is None:
        workflow = StepFunctionsWorkflow(
            client=adapters.stepfunctions, state_machine_arn=settings.pipeline.state_machine_arn
        )
    files = FileService(settings=settings, blobs=adapters.blobs, table=adapters.table)
    events = StateChanges(adapters.event_bus) if adapters.event_bus is not None else None
    batches = BatchService(settings=settings, table=adapters.table, files=files, workflow=workflow, events=events)
    parts = PartStore(adapters.blobs)
    thread_jobs: ThreadUploadJobs | None = None
    if upload_jobs is None:
        if settings.uploads.queue_url:
            upload_jobs = SqsUploadJobs(client=adapters.client("sqs"), queue_url=settings.uploads.queue_url)
        else:
            if settings.deployment.mode == "aws":
                log.warning("upload_queue_url is not set: uploads compose on a thread of the API process")
            upload_jobs = thread_jobs = ThreadUploadJobs()
    assembly = AssemblyService(settings=settings, table=adapters.table, parts=parts, jobs=upload_jobs)
    if thread_jobs is not None:
        thread_jobs.bind(assembly)
    uploads = UploadService(settings=settings, table=adapters.table, files=files, parts=parts, jobs=upload_jobs)
    return Services(settings=settings, adapters=adapters, files=files, batches=batches, uploads=uploads,
                    assembly=assembly)


def build_notifier(
    adapters: Adapters, *, queue: DeliveryQueue | None = None, post: Poster = transport.post,
    resolver: Resolver | None = None,
) -> Notifier:
    """SQS when a queue URL is configured; in the local mode, an in-process delayed queue feeding the same code."""
    settings = adapters.settings
    notes = settings.notifications
    topic = Topic(client=adapters.sns, topic_arn=notes.topic_arn) if notes.topic_arn else None
    mailer = None
    if notes.email_sender:
        mailer = Mailer(client=adapters.client("ses"), sender=notes.email_sender,
                        configuration_set=notes.email_configuration_set)
    if queue is None:
        if notes.webhook_queue_url:
            queue = SqsDeliveryQueue(client=adapters.client("sqs"), queue_url=notes.webhook_queue_url)
        elif settings.deployment.mode == "local":
            # The consumer is the Deliveries made just below (the name is looked up when a message arrives).
            queue = InProcessQueue(lambda message: deliveries.handle_message(message))
    sealer = sealer_of(adapters)
    deliveries = Deliveries(settings=settings, table=adapters.table, queue=queue, post=post, resolver=resolver,
                            sealer=sealer)
    endpoints = WebhookEndpointService(settings=settings, table=adapters.table, resolver=resolver, sealer=sealer)
    events = StateChanges(adapters.event_bus) if adapters.event_bus is not None else None
    return Notifier(settings=settings, table=adapters.table, topic=topic, mailer=mailer, endpoints=endpoints,
                    deliveries=deliveries, adapters=adapters, events=events)


def sealer_of(adapters: Adapters) -> Sealer:
    """Webhook signing secrets sealed with the stack's KMS key when one is configured (the AWS mode)."""
    key = adapters.settings.notifications.secrets_kms_key
    return KmsSealer(client=adapters.client("kms"), key_id=key) if key else PlainSealer()


@lru_cache(maxsize=1)
def default_services() -> Services:
    """The services of a Lambda or worker process: AWS adapters and the Step Functions workflow."""
    return build_services(make_adapters(get_settings()))
