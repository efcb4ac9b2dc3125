"""The Notify step: one event per terminal transition, then webhooks, SNS, EventBridge and email, each at most
once per run.

`notify_batch` is idempotent. The event item is created by a conditional put keyed by batch and status; each
channel leaves a mark on it (deliveries are items of their own), so a second run (Finalize or Notify retried)
sends nothing twice, and a run that failed half-way completes what is missing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

from nightbatch.aws import Adapters, Table
from nightbatch.aws.records import BatchRecord, EventRecord
from nightbatch.aws.ses import EmailRejectedError, Mailer
from nightbatch.aws.sns import Topic
from nightbatch.batches.objects import to_wire as batch_to_wire
from nightbatch.batches.recipients import recipients
from nightbatch.errors import NightbatchError, check_supported
from nightbatch.files.links import link_keys, link_keys_from, sign_link
from nightbatch.notifications.delivery import Deliveries
from nightbatch.notifications.email import compose
from nightbatch.notifications.endpoints import WebhookEndpointService
from nightbatch.notifications.events import close_event, mark_event, record_event
from nightbatch.notifications.objects import BATCH_EVENT_TYPES, DeliveryAttempt, WebhookEndpointTestResult
from nightbatch.notifications.queues import DeliveryQueue
from nightbatch.notifications.state_changes import StateChanges
from nightbatch.settings import Settings
from nightbatch.wire import TERMINAL_STATUSES

log = logging.getLogger("nightbatch.notifications")

SNS_MAX_BYTES = 256 * 1024


class NotifyError(NightbatchError):
    """A channel failed after the others ran; the step is retried and the retry sends only what is missing."""


class NotifyResult(BaseModel):
    version: Literal[1] = 1
    batch_id: str
    status: Literal["notified", "not_terminal", "missing"]
    event_id: str | None = None
    event_type: str | None = None
    event_created: bool = False
    deliveries_enqueued: int = 0
    sns_message_id: str | None = None
    bus_event_id: str | None = None
    emails_sent: int = 0


@dataclass(kw_only=True)
class Notifier:
    """Its parts are wired by nightbatch.wiring (SNS and SES only when configured)."""

    settings: Settings
    table: Table
    topic: Topic | None
    mailer: Mailer | None
    endpoints: WebhookEndpointService
    deliveries: Deliveries
    adapters: Adapters | None = None  # for the link-signing keys in Secrets Manager
    events: StateChanges | None = None  # EventBridge, when a bus is configured

    @property
    def queue(self) -> DeliveryQueue | None:
        return self.deliveries.queue

    def handle_message(self, message: dict[str, Any]) -> DeliveryAttempt | None:
        return self.deliveries.handle_message(message)

    def close(self) -> None:
        if self.queue is not None:
            self.queue.close()

    def test_endpoint(self, tenant: str, endpoint_id: str, event_type: str) -> WebhookEndpointTestResult:
        """`webhooks.test`: queues one signed sample event to the tenant's endpoint and answers at once.

        The delivery path of real events sends it; its outcome is read from the endpoint's deliveries."""
        check_supported(event_type, BATCH_EVENT_TYPES, param="event_type")
        endpoint = self.endpoints.item(tenant, endpoint_id)
        delivery = self.deliveries.enqueue_test(endpoint, event_type)
        return WebhookEndpointTestResult(event_type=event_type, webhook_endpoint_id=endpoint_id,
                                         delivery_id=delivery.pk)

    def notify_batch(self, batch_id: str) -> NotifyResult:
        batch = self.table.get_record(BatchRecord, batch_id)
        if batch is None:
            return NotifyResult(batch_id=batch_id, status="missing")
        if batch.status not in TERMINAL_STATUSES:
            return NotifyResult(batch_id=batch_id, status="not_terminal")
        event, created = record_event(self.table, batch)
        result = NotifyResult(batch_id=batch_id, status="notified", event_id=event.event_id,
                              event_type=event.type, event_created=created,
                              sns_message_id=event.sns_message_id, bus_event_id=event.bus_event_id)
        failed: list[str] = []
        for channel, send in (("webhooks", self._webhooks), ("sns", self._sns), ("eventbridge", self._eventbridge),
                              ("email", self._email)):
            try:
                send(batch, event, result)
            except Exception:
                log.exception("notify %s: %s failed", batch_id, channel)
                failed.append(channel)
        if failed:
            # The step retries with backoff; past that the sweeper re-drives the still-open event.
            raise NotifyError(f"Notifying {batch_id} failed for: {', '.join(failed)}.")
        if event.open_status:
            close_event(self.table, event.pk)
        return result

    def _webhooks(self, batch: BatchRecord, event: EventRecord, result: NotifyResult) -> None:
        for endpoint in self.endpoints.all_items(batch.tenant):
            if event.type in endpoint.event_types:
                delivery = self.deliveries.create(event, endpoint)
                result.deliveries_enqueued += int(self.deliveries.enqueue_first(delivery))

    def _sns(self, batch: BatchRecord, event: EventRecord, result: NotifyResult) -> None:
        if self.topic is None or event.sns_message_id:
            return
        wire = batch_to_wire(batch)
        message = wire.model_dump_json()
        if len(message.encode()) > SNS_MAX_BYTES and wire.errors is not None:
            # SNS caps a message at 256 KiB; errors.data may hold a thousand lines. Subscribers can retrieve().
            wire.errors.data = wire.errors.data[:20]
            message = wire.model_dump_json()
        result.sns_message_id = self.topic.publish(
            message, subject=f"nightbatch {event.type} {batch.pk}",
            attributes={"tenant": batch.tenant, "event_type": event.type, "event_id": event.event_id,
                        "batch_id": batch.pk},
        )
        mark_event(self.table, event.pk, "sns_message_id", result.sns_message_id)

    def _eventbridge(self, batch: BatchRecord, event: EventRecord, result: NotifyResult) -> None:
        """The terminal state change (nightbatch/notifications/state_changes.py), put once: its id marks the event."""
        if self.events is None or event.bus_event_id:
            return
        result.bus_event_id = self.events.put(batch)
        mark_event(self.table, event.pk, "bus_event_id", result.bus_event_id)

    def _email(self, batch: BatchRecord, event: EventRecord, result: NotifyResult) -> None:
        to, refused = recipients(self.settings, batch.options)
        if refused:
            log.warning("notify %s: not emailing %s (domain not in NIGHTBATCH_EMAIL_ALLOWED_DOMAINS)",
                        batch.pk, ", ".join(refused))
        done = [*(event.emailed_to or []), *(event.email_rejected or [])]
        pending = [a for a in to if a not in done]
        if not pending:
            return
        wire = batch_to_wire(batch)
        links, expires_at = self._links([fid for fid in (wire.output_file_id, wire.error_file_id) if fid])
        subject, text = compose(wire, links, links_expire_at=expires_at)
        # Never the text: its links are credentials for the batch's output (anyone with log access could use them).
        log.info("notify %s: e-mail to %d recipient(s)", batch.pk, len(pending), extra={"batch_id": batch.pk})
        if self.mailer is None:
            log.warning("notify %s: email not sent, no sender identity (NIGHTBATCH_EMAIL_SENDER)", batch.pk)
            return
        sent = list(event.emailed_to or [])
        rejected = list(event.email_rejected or [])
        transient: Exception | None = None
        for address in pending:
            try:
                self.mailer.send_text(address, subject=subject, text=text)
            except EmailRejectedError as e:
                # Permanent (e.g. an unverified recipient in the SES sandbox): logged, never retried.
                log.warning("notify %s: SES rejected the e-mail to %s: %s", batch.pk, address, e)
                rejected.append(address)
                mark_event(self.table, event.pk, "email_rejected", rejected)
                continue
            except Exception as e:  # throttling, service errors: the step's retry sends what is missing
                transient = e
                continue
            sent.append(address)
            mark_event(self.table, event.pk, "emailed_to", sent)
            result.emails_sent += 1
        if transient is not None:
            raise transient

    def _links(self, file_ids: list[str]) -> tuple[dict[str, str | None], int | None]:
        """Signed download links (nightbatch.files.links), or none when they could not be followed."""
        s = self.settings
        base = s.notifications.public_base_url.rstrip("/").removesuffix("/v1")
        # Without a shared key each process signs with its own, and only the local mode (one process) could
        # verify what the Notify Lambda signs.
        if not file_ids or not base or (s.deployment.mode != "local" and not (s.links.secret or s.links.keys_secret)):
            return {}, None
        keys = link_keys_from(self.adapters) if self.adapters is not None else link_keys(s)
        signed = [sign_link(s, fid, ttl_seconds=s.notifications.email_link_ttl_seconds, keys=keys) for fid in file_ids]
        return {link.file_id: base + link.path for link in signed}, signed[0].expires_at


def notify_batch(batch_id: str, *, notifier: Notifier) -> NotifyResult:
    """The workflow's Notify step, after any terminal transition (idempotent; see the module docstring)."""
    return notifier.notify_batch(batch_id)
