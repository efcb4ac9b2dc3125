"""Webhook endpoints of a tenant: create, list newest first, retrieve, update, delete, rotate the secret."""

from __future__ import annotations

import builtins
import secrets
from typing import Any, Protocol

from nightbatch.clock import now
from nightbatch.errors import InvalidRequestError, NotFoundError
from nightbatch.notifications.events import precise_sort_key
from nightbatch.notifications.models import (
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
from nightbatch.storage import Table
from nightbatch.wire import ListPage

ENDPOINT_PREFIX = "whep_"
MAX_LIST_LIMIT = 100
MAX_NAME_LENGTH = 256
# keep_old_secret_active_for_24_hours: the previous secret keeps signing (second signature) for this long.
ROTATION_OVERLAP_SECONDS = 24 * 3600


def owner(tenant: str) -> str:
    return f"{tenant}#webhook_endpoint"


class Sealer(Protocol):
    """Encrypts a signing secret for the table (nightbatch.storage.kms); the identity when no key is set."""

    def seal(self, plaintext: str, context: str) -> str: ...

    def open(self, value: str, context: str) -> str: ...


class PlainSealer:
    def seal(self, plaintext: str, context: str) -> str:
        return plaintext

    def open(self, value: str, context: str) -> str:
        return value


def to_wire(item: dict[str, Any]) -> WebhookEndpoint:
    hint = item.get("secret_hint") or secret_hint(str(item["secret"]))
    return WebhookEndpoint(
        id=item["pk"], created_at=item["created_at"], event_types=list(item["event_types"]), name=item["name"],
        signing_secret_hint=hint, url=item["url"], updated_at=item.get("updated_at"),
    )


def with_secret(item: dict[str, Any], secret: str) -> WebhookEndpointWithSecret:
    return WebhookEndpointWithSecret(**to_wire(item).model_dump(), signing_secret=secret)


def signing_secrets(item: dict[str, Any], *, at: int, sealer: Sealer | None = None) -> list[str]:
    """The current secret, plus the previous one while its rotation overlap lasts (opened from the table)."""
    sealer = sealer or PlainSealer()
    out = [sealer.open(str(item["secret"]), item["pk"])]
    if item.get("previous_secret") and int(item.get("previous_secret_expires_at", 0)) > at:
        out.append(sealer.open(str(item["previous_secret"]), item["pk"]))
    return out


def check_event_types(values: list[Any]) -> list[str]:
    if not values:
        raise InvalidRequestError("Invalid 'event_types': expected at least one event type.",
                                  param="event_types", code="invalid_value")
    out: list[str] = []
    for i, v in enumerate(values):
        if v not in BATCH_EVENT_TYPES:
            raise InvalidRequestError(
                f"Invalid value for 'event_types[{i}]': {v!r}. Supported values are: "
                + ", ".join(f"'{t}'" for t in BATCH_EVENT_TYPES) + ".",
                param=f"event_types[{i}]", code="invalid_value",
            )
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
        resolve_target(url, allow_private=self.settings.allow_private_targets, resolver=self.resolver)
        return url

    def _check_room(self, tenant: str, url: str, *, exclude: str | None = None) -> None:
        """At most `max_webhook_endpoints` per tenant (each event fans out to all of them), one per URL."""
        existing = [i for i in self.all_items(tenant) if i["pk"] != exclude]
        if any(i["url"] == url for i in existing):
            raise InvalidRequestError("Invalid 'url': another webhook endpoint of this project already has this "
                                      "URL.", param="url", code="duplicate_url")
        cap = self.settings.max_webhook_endpoints
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
        item: dict[str, Any] = {
            "pk": endpoint_id, "kind": "webhook_endpoint", "tenant": tenant, "owner": owner(tenant),
            "owner_sk": precise_sort_key(endpoint_id), "created_at": created, "updated_at": created,
            "event_types": event_types, "name": name, "url": url,
        }
        secret = new_secret()
        # Sealed with the stack's KMS key: table read access alone does not reveal it.
        item.update(secret=self.sealer.seal(secret, endpoint_id), secret_hint=secret_hint(secret))
        self.table.put_new(item)
        return with_secret(item, secret)

    def item(self, tenant: str, endpoint_id: str) -> dict[str, Any]:
        item = self.table.get(endpoint_id) if endpoint_id.startswith(ENDPOINT_PREFIX) else None
        if item is None or item.get("kind") != "webhook_endpoint" or item.get("tenant") != tenant:
            raise NotFoundError(f"No webhook endpoint found with id '{endpoint_id}'.", param="webhook_endpoint_id")
        return item

    def get(self, tenant: str, endpoint_id: str) -> WebhookEndpoint:
        return to_wire(self.item(tenant, endpoint_id))

    def list(self, tenant: str, *, limit: int, after: str | None) -> ListPage[WebhookEndpoint]:
        if not 1 <= limit <= MAX_LIST_LIMIT:
            raise InvalidRequestError(f"Invalid 'limit': {limit}. Expected a value between 1 and {MAX_LIST_LIMIT}.",
                                      param="limit", code="invalid_value")
        after_sk = None
        if after:
            cursor = self.table.get(after) if after.startswith(ENDPOINT_PREFIX) else None
            if cursor is None or cursor.get("kind") != "webhook_endpoint" or cursor.get("tenant") != tenant:
                raise InvalidRequestError(f"Invalid 'after': no webhook endpoint with id '{after}'.", param="after")
            after_sk = str(cursor["owner_sk"])
        data: list[WebhookEndpoint] = []
        has_more = False
        for item in self.table.query_owner(owner(tenant), ascending=False, after_sk=after_sk, page_size=limit + 1):
            if len(data) == limit:
                has_more = True
                break
            data.append(to_wire(item))
        return ListPage(data=data, has_more=has_more, first_id=data[0].id if data else None,
                        last_id=data[-1].id if data else None)

    def all_items(self, tenant: str) -> builtins.list[dict[str, Any]]:
        return list(self.table.query_owner(owner(tenant), ascending=True))

    def update(self, tenant: str, endpoint_id: str, req: UpdateWebhookEndpointRequest) -> WebhookEndpoint:
        item = self.item(tenant, endpoint_id)
        fields: dict[str, Any] = {}
        if req.event_types is not None:
            fields["event_types"] = check_event_types(req.event_types)
        if req.name is not None:
            fields["name"] = check_name(req.name)
        if req.url is not None:
            fields["url"] = self._check_url(req.url)
            if fields["url"] != item["url"]:
                self._check_room(tenant, fields["url"], exclude=endpoint_id)
        changed = {k: v for k, v in fields.items() if item.get(k) != v}
        if not changed:
            return to_wire(item)  # the SDK documents that unchanged updates do not advance updated_at
        changed["updated_at"] = now()
        return to_wire(self.table.update(endpoint_id, set_=changed))

    def rotate_secret(self, tenant: str, endpoint_id: str, *, keep_old: bool) -> WebhookEndpointWithSecret:
        item = self.item(tenant, endpoint_id)
        at = now()
        secret = new_secret()
        fields: dict[str, Any] = {"secret": self.sealer.seal(secret, endpoint_id), "secret_hint": secret_hint(secret),
                                  "updated_at": at}
        remove: tuple[str, ...] = ()
        if keep_old:
            fields["previous_secret"] = item["secret"]
            fields["previous_secret_expires_at"] = at + ROTATION_OVERLAP_SECONDS
        else:
            remove = ("previous_secret", "previous_secret_expires_at")
        return with_secret(self.table.update(endpoint_id, set_=fields, remove=remove), secret)

    def delete(self, tenant: str, endpoint_id: str) -> DeletedWebhookEndpoint:
        self.item(tenant, endpoint_id)
        self.table.delete(endpoint_id)
        return DeletedWebhookEndpoint(id=endpoint_id)
