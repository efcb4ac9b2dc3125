"""Webhook deliveries: one per (event, endpoint), attempted at least once until a 2xx or the max age.

Every attempt signs the stored body bytes afresh (new timestamp, same `webhook-id` = the delivery id), is recorded
on the delivery item, and on failure schedules the next attempt through the queue with exponential backoff.
A duplicate queue message (SQS is at-least-once) cannot fork the schedule: the attempt number it carries must be
the next one, and the record of an attempt is a conditional write on the attempt count.
"""

from __future__ import annotations

import logging
import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nightbatch.aws import Table
from nightbatch.aws.records import DeliveryRecord, EventRecord, WebhookEndpointRecord
from nightbatch.clock import now
from nightbatch.errors import NightbatchError, StorageConflictError, check_range
from nightbatch.ids import derived_id
from nightbatch.listing import after_sort_key
from nightbatch.notifications import transport
from nightbatch.notifications.endpoints import PlainSealer, Sealer, signing_secrets
from nightbatch.notifications.events import event_body
from nightbatch.notifications.objects import DeliveryAttempt, DeliveryMessage, WebhookDelivery
from nightbatch.notifications.queues import DeliveryQueue
from nightbatch.notifications.signatures import signed_headers
from nightbatch.notifications.targets import Resolver, TargetRefusedError, resolve_target
from nightbatch.settings import Settings
from nightbatch.wire import ListPage, list_page

log = logging.getLogger("nightbatch.notifications")

MAX_LIST_LIMIT = 100
RETAIN_SECONDS = 30 * 86400  # delivery records stay listable this long after the retries end
# A message that arrives this early is put back rather than attempted (SQS's 15-minute delay cap, clock skew).
EARLY_TOLERANCE_SECONDS = 1.0
Poster = Callable[..., transport.PostResult]


def delivery_id(event_id: str, endpoint_id: str) -> str:
    """Derived, so that a re-run of Notify finds the delivery it made before."""
    return derived_id("wh_", event_id, endpoint_id, length=32)


def to_wire(rec: DeliveryRecord) -> WebhookDelivery:
    return WebhookDelivery(
        id=rec.pk, webhook_endpoint_id=rec.endpoint_id, event_id=rec.event_id, event_type=rec.event_type,
        batch_id=rec.batch_id, status=rec.status, test=bool(rec.test), created_at=rec.created_at,
        next_attempt_at=rec.next_attempt_at, attempts=[DeliveryAttempt.model_validate(a) for a in rec.attempts],
    )


@dataclass(kw_only=True)
class Deliveries:
    settings: Settings
    table: Table
    queue: DeliveryQueue | None
    post: Poster = transport.post
    resolver: Resolver | None = None
    sealer: Sealer = field(default_factory=PlainSealer)

    def backoff(self, attempts_done: int) -> float:
        s = self.settings.notifications
        return float(min(s.webhook_retry_base_seconds * 2 ** (attempts_done - 1), s.webhook_retry_max_delay_seconds))

    def create(self, event: EventRecord, endpoint: WebhookEndpointRecord) -> DeliveryRecord:
        """The delivery of `event` to `endpoint` (the existing one when a previous run made it)."""
        pk = delivery_id(event.event_id, endpoint.pk)
        created = now()
        rec = DeliveryRecord(
            pk=pk, tenant=event.tenant, endpoint_id=endpoint.pk, event_id=event.event_id,
            event_type=event.type, batch_id=event.batch_id, body=event.body, status="pending",
            created_at=created, next_attempt_at=created, created_ts=time.time(),
            ttl=created + int(self.settings.notifications.webhook_max_age_seconds) + RETAIN_SECONDS,
        )
        try:
            self.table.put_record(rec, new=True)
        except StorageConflictError:
            return self.table.get_record(DeliveryRecord, pk) or rec
        return rec

    def enqueue_first(self, rec: DeliveryRecord) -> bool:
        if rec.enqueued or rec.attempt_count > 0:
            return False
        if self.queue is None:
            log.error("no webhook queue configured (NIGHTBATCH_WEBHOOK_QUEUE_URL); %s not sent", rec.pk)
            return False
        self.queue.send(DeliveryMessage(delivery_id=rec.pk, attempt=1, not_before=time.time()).model_dump(), 0)
        # Marked after the send: a crash in between re-sends on the next run (at least once, never zero).
        self.table.update_attributes(DeliveryRecord, rec.pk, set_={"enqueued": True})
        return True

    def handle_message(self, message: dict[str, Any]) -> DeliveryAttempt | None:
        """The queue consumer: puts back a message that is early (past SQS's delay cap), else attempts it."""
        msg = DeliveryMessage.model_validate(message)
        early = msg.not_before - time.time()
        if early > EARLY_TOLERANCE_SECONDS and self.queue is not None:
            self.queue.send(message, early)
            return None
        return self.deliver_once(msg.delivery_id, attempt=msg.attempt)

    def deliver_once(self, delivery_id: str, *, attempt: int | None = None) -> DeliveryAttempt | None:
        """One attempt; None when there is nothing to do (done already, or a stale duplicate message)."""
        item = self.table.get_record(DeliveryRecord, delivery_id)
        if item is None or item.status != "pending":
            return None
        n = item.attempt_count + 1
        if attempt is not None and attempt < n:
            return None  # a duplicate of a message whose attempt is recorded
        # attempt > n: the retry was queued but its attempt never recorded (a crash in between); go on as n.
        endpoint = self.table.get_record(WebhookEndpointRecord, item.endpoint_id)
        at = now()
        final = False
        if endpoint is None:
            result, final = transport.PostResult(None, "the webhook endpoint was deleted", 0), True
        else:
            result = self._post(delivery_id, item.body.encode(), endpoint, at)
        status, next_at = "succeeded", None
        if not result.ok:
            delay = self.backoff(n)
            give_up_at = float(item.created_ts or item.created_at) + self.settings.notifications.webhook_max_age_seconds
            if final or item.test or time.time() + delay > give_up_at:  # a test event is never retried
                status = "failed"
            else:
                status, next_at = "pending", time.time() + delay
        record = DeliveryAttempt(
            attempt=n, attempted_at=at, status_code=result.status_code, error=_error_text(result),
            duration_ms=result.duration_ms, next_attempt_at=math.ceil(next_at) if next_at else None,
        )
        if next_at is not None and self.queue is not None:
            # Queued before the attempt is recorded: a crash in between costs one extra attempt, never the
            # delivery (recorded first, a lost send would leave it `pending` with nothing left to retry it).
            msg = DeliveryMessage(delivery_id=delivery_id, attempt=n + 1, not_before=next_at)
            self.queue.send(msg.model_dump(), next_at - time.time())
        try:
            self.table.update_attributes(DeliveryRecord, delivery_id, set_={
                "attempt_count": n, "attempts": [*item.attempts, record.model_dump()],
                "status": status, "next_attempt_at": record.next_attempt_at,
            }, expect_in={"attempt_count": (n - 1,)})
        except StorageConflictError:
            return None  # a duplicate message attempted it too; its retry message makes ours a no-op
        log.info("webhook %s attempt %d to %s: %s", delivery_id, n, item.endpoint_id,
                 record.status_code or record.error, extra={"delivery_id": delivery_id, "status": status})
        return record

    def _post(self, delivery_id: str, body: bytes, endpoint: WebhookEndpointRecord, at: int) -> transport.PostResult:
        try:
            target = resolve_target(endpoint.url, allow_private=self.settings.notifications.allow_private_targets,
                                    resolver=self.resolver)
        except TargetRefusedError as e:
            return transport.PostResult(None, e.message, 0)
        headers = signed_headers(delivery_id, body, signing_secrets(endpoint, at=at, sealer=self.sealer), at=at)
        return self.post(target, body=body, headers=headers,
                         timeout=self.settings.notifications.webhook_timeout_seconds)

    def enqueue_test(self, endpoint: WebhookEndpointRecord, event_type: str) -> DeliveryRecord:
        """`webhooks.test`: one signed sample event, recorded `pending` and queued like any delivery.

        The queue's consumer sends it (one attempt, never retried), so a slow or silent receiver holds a
        delivery worker for its timeout, never the API request that asked for the test."""
        if self.queue is None:
            raise NightbatchError("Webhook tests are unavailable: no delivery queue is configured "
                                  "(NIGHTBATCH_WEBHOOK_QUEUE_URL).")
        at = now()
        event_id = f"evt_test_{secrets.token_hex(12)}"
        batch_id = f"batch_test_{secrets.token_hex(12)}"
        rec = DeliveryRecord(
            pk=f"wh_{secrets.token_hex(16)}", tenant=endpoint.tenant, endpoint_id=endpoint.pk, event_id=event_id,
            event_type=event_type, batch_id=batch_id, body=event_body(event_id, event_type, at, batch_id),
            status="pending", test=True, created_at=at, next_attempt_at=at, created_ts=time.time(),
            ttl=at + int(self.settings.notifications.webhook_max_age_seconds) + RETAIN_SECONDS,
        )
        self.table.put_record(rec, new=True)
        try:
            self.enqueue_first(rec)
        except Exception:
            # Not queued, so nothing would ever attempt it: it must not stay `pending`.
            self.table.update_attributes(DeliveryRecord, rec.pk, set_={"status": "failed", "next_attempt_at": None})
            raise
        return rec

    def list(self, tenant: str, endpoint_id: str, *, limit: int, after: str | None) -> ListPage[WebhookDelivery]:
        check_range(limit, 1, MAX_LIST_LIMIT, param="limit")
        after_sk = after_sort_key(self.table, DeliveryRecord, tenant, after, noun="delivery",
                                  belongs=lambda r: r.endpoint_id == endpoint_id)
        recs, has_more = self.table.page(DeliveryRecord, DeliveryRecord.owner_of_endpoint(tenant, endpoint_id),
                                         limit=limit, after_sk=after_sk)
        return list_page([to_wire(r) for r in recs], has_more)


def _error_text(result: transport.PostResult) -> str | None:
    if result.error:
        return result.error
    if result.status_code is not None and 300 <= result.status_code < 400:
        return "redirects are not followed"
    if result.status_code is not None and not result.ok:
        return f"HTTP {result.status_code}"
    return None
