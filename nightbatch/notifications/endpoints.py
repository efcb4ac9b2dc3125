"""Webhook endpoints of a tenant: create, list newest first, retrieve, update, delete, rotate the secret."""

from __future__ import annotations

import builtins
import secrets
from typing import Any, Protocol

from nightbatch.aws import Table
from nightbatch.aws.records import WebhookEndpointRecord
from nightbatch.clock import now
from nightbatch.errors import InvalidRequestError, check_range, check_supported
from nightbatch.listing import after_sort_key
from nightbatch.notifications.objects import (
    BATCH_EVENT_TYPES,
    CreateWebhookEndpointRequest,
    DeletedWebhookEndpoint,
    UpdateWebhookEndpointRequest,
    WebhookEndpoint,
    WebhookEndpointWithSecret,
)
from nightbatch.notifications.signatures import new_secret, secret_hint
from nightbatch.notifications.targets import Resolver, resolve_target
from nightbatch.settings import Settings
from nightbatch.wire import ListPage, list_page

ENDPOINT_PREFIX = "whep_"
MAX_LIST_LIMIT = 100
MAX_NAME_LENGTH = 256
# keep_old_secret_active_for_24_hours: the previous secret keeps signing (second signature) for this long.
ROTATION_OVERLAP_SECONDS = 24 * 3600


class Sealer(Protocol):
    """Encrypts a signing secret for the table (nightbatch.aws.kms); the identity when no key is set."""

    def seal(self, plaintext: str, context: str) -> str: ...

    def open(self, value: str, context: str) -> str: ...


class PlainSealer:
    def seal(self, plaintext: str, context: str) -> str:
        return plaintext

    def open(self, value: str, context: str) -> str:
        return value


def to_wire(rec: WebhookEndpointRecord) -> WebhookEndpoint:
    hint = rec.secret_hint or secret_hint(rec.secret)
    return WebhookEndpoint(
        id=rec.pk, created_at=rec.created_at, event_types=list(rec.event_types), name=rec.name,
        signing_secret_hint=hint, url=rec.url, updated_at=rec.updated_at,
    )


def with_secret(rec: WebhookEndpointRecord, secret: str) -> WebhookEndpointWithSecret:
    return WebhookEndpointWithSecret(**to_wire(rec).model_dump(), signing_secret=secret)


def signing_secrets(rec: WebhookEndpointRecord, *, at: int, sealer: Sealer | None = None) -> list[str]:
    """The current secret, plus the previous one while its rotation overlap lasts (opened from the table)."""
    sealer = sealer or PlainSealer()
    out = [sealer.open(rec.secret, rec.pk)]
    if rec.previous_secret and (rec.previous_secret_expires_at or 0) > at:
        out.append(sealer.open(rec.previous_secret, rec.pk))
    return out


def check_event_types(values: list[Any]) -> list[str]:
    if not values:
        raise InvalidRequestError("Invalid 'event_types': expected at least one event type.",
                                  param="event_types", code="invalid_value")
    out: list[str] = []
    for i, v in enumerate(values):
        check_supported(v, BATCH_EVENT_TYPES, param=f"event_types[{i}]", label=f"event_types[{i}]")
        if v not in out:
            out.append(str(v))
    return out


def check_name(name: str) -> str:
    if not name.strip() or len(name) > MAX_NAME_LENGTH:
        raise InvalidRequestError(f"Invalid 'name': expected 1 to {MAX_NAME_LENGTH} characters.",
                                  param="name", code="invalid_value")
    return name


class WebhookEndpointService:
    def __init__(self, *, settings: Settings, table: Table, resolver: Resolver | None = None,
                 sealer: Sealer | None = None) -> None:
        self.settings = settings
        self.table = table
        self.resolver = resolver
        self.sealer: Sealer = sealer or PlainSealer()

    def _check_url(self, url: str) -> str:
        # Checked again at every delivery: DNS may change after creation.
        resolve_target(url, allow_private=self.settings.notifications.allow_private_targets, resolver=self.resolver)
        return url

    def _check_room(self, tenant: str, url: str, *, exclude: str | None = None) -> None:
        """At most `max_webhook_endpoints` per tenant (each event fans out to all of them), one per URL."""
        existing = [r for r in self.all_items(tenant) if r.pk != exclude]
        if any(r.url == url for r in existing):
            raise InvalidRequestError("Invalid 'url': another webhook endpoint of this project already has this "
                                      "URL.", param="url", code="duplicate_url")
        cap = self.settings.notifications.max_webhook_endpoints
        if exclude is None and cap and len(existing) >= cap:
            raise InvalidRequestError(f"This project already has {len(existing)} webhook endpoints, the most "
                                      "allowed on this deployment; delete one first.", code="too_many_endpoints")

    def create(self, tenant: str, req: CreateWebhookEndpointRequest) -> WebhookEndpointWithSecret:
        event_types = check_event_types(req.event_types)
        name = check_name(req.name)
        url = self._check_url(req.url)
        self._check_room(tenant, url)
        endpoint_id = ENDPOINT_PREFIX + secrets.token_hex(12)
        created = now()
        secret = new_secret()
        rec = WebhookEndpointRecord(
            pk=endpoint_id, tenant=tenant, created_at=created, updated_at=created, event_types=event_types,
            name=name, url=url,
            # Sealed with the stack's KMS key: table read access alone does not reveal it.
            secret=self.sealer.seal(secret, endpoint_id), secret_hint=secret_hint(secret),
        )
        self.table.put_record(rec, new=True)
        return with_secret(rec, secret)

    def item(self, tenant: str, endpoint_id: str) -> WebhookEndpointRecord:
        return self.table.require_owned(WebhookEndpointRecord, tenant, endpoint_id, param="webhook_endpoint_id",
                                        missing=f"No webhook endpoint found with id '{endpoint_id}'.")

    def get(self, tenant: str, endpoint_id: str) -> WebhookEndpoint:
        return to_wire(self.item(tenant, endpoint_id))

    def list(self, tenant: str, *, limit: int, after: str | None) -> ListPage[WebhookEndpoint]:
        check_range(limit, 1, MAX_LIST_LIMIT, param="limit")
        after_sk = after_sort_key(self.table, WebhookEndpointRecord, tenant, after, noun="webhook endpoint")
        recs, has_more = self.table.page(WebhookEndpointRecord, WebhookEndpointRecord.owner_of(tenant), limit=limit,
                                         after_sk=after_sk)
        return list_page([to_wire(r) for r in recs], has_more)

    def all_items(self, tenant: str) -> builtins.list[WebhookEndpointRecord]:
        return list(self.table.records(WebhookEndpointRecord, WebhookEndpointRecord.owner_of(tenant), ascending=True))

    def update(self, tenant: str, endpoint_id: str, req: UpdateWebhookEndpointRequest) -> WebhookEndpoint:
        rec = self.item(tenant, endpoint_id)
        fields: dict[str, Any] = {}
        if req.event_types is not None:
            fields["event_types"] = check_event_types(req.event_types)
        if req.name is not None:
            fields["name"] = check_name(req.name)
        if req.url is not None:
            fields["url"] = self._check_url(req.url)
            if fields["url"] != rec.url:
                self._check_room(tenant, fields["url"], exclude=endpoint_id)
        changed = {k: v for k, v in fields.items() if getattr(rec, k) != v}
        if not changed:
            return to_wire(rec)  # the SDK documents that unchanged updates do not advance updated_at
        changed["updated_at"] = now()
        return to_wire(self.table.update_record(WebhookEndpointRecord, endpoint_id, set_=changed))

    def rotate_secret(self, tenant: str, endpoint_id: str, *, keep_old: bool) -> WebhookEndpointWithSecret:
        rec = self.item(tenant, endpoint_id)
        at = now()
        secret = new_secret()
        fields: dict[str, Any] = {"secret": self.sealer.seal(secret, endpoint_id), "secret_hint": secret_hint(secret),
                                  "updated_at": at}
        remove: tuple[str, ...] = ()
        if keep_old:
            fields["previous_secret"] = rec.secret
            fields["previous_secret_expires_at"] = at + ROTATION_OVERLAP_SECONDS
        else:
            remove = ("previous_secret", "previous_secret_expires_at")
        rec = self.table.update_record(WebhookEndpointRecord, endpoint_id, set_=fields, remove=remove)
        return with_secret(rec, secret)

    def delete(self, tenant: str, endpoint_id: str) -> DeletedWebhookEndpoint:
        self.item(tenant, endpoint_id)
        self.table.delete(endpoint_id)
        return DeletedWebhookEndpoint(id=endpoint_id)
