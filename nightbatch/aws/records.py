"""Typed records: one model per kind of item in the table, with its index keys derived here.

Use cases build and read these, never raw items: `to_item()` is what is written (index keys included),
`load()` what is read. Fields that other code paths add with partial updates (pipeline progress, compose
marks, …) are kept as extras, so a record read, changed and written back loses nothing.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict

from nightbatch.clock import listing_key, sort_key

# Statuses after which a batch leaves the open-status index (same as wire.TERMINAL_STATUSES).
_TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})


def precise_sort_key(item_id: str) -> str:
    """Creation order to the microsecond (several endpoints or deliveries are often made within one second)."""
    return f"{time.time_ns() // 1000:017d}#{item_id}"


class Record(BaseModel):
    # Schemas are built on first use: a request builds only the records it touches (API cold import, #17).
    model_config = ConfigDict(extra="allow", defer_build=True)

    KIND: ClassVar[str]
    ID_PREFIX: ClassVar[str] = ""
    # Attributes derived on write (index keys, ttl), never read back as fields.
    DERIVED: ClassVar[tuple[str, ...]] = ("owner", "created_sk", "open_status")

    pk: str
    kind: str = ""
    tenant: str

    def model_post_init(self, context: Any, /) -> None:
        self.kind = self.KIND

    @classmethod
    def owner_of(cls, tenant: str) -> str | None:
        """The owner-index partition the kind's items are listed under (None: not listed)."""
        return None

    def owner(self) -> str | None:
        return self.owner_of(self.tenant)

    @classmethod
    def identity(cls, tenant: str) -> dict[str, Any]:
        """The attributes that make an item this kind's and the tenant's: set when an update may create it."""
        return {"kind": cls.KIND, "tenant": tenant}

    def index_keys(self) -> dict[str, Any]:
        return {}

    def to_item(self) -> dict[str, Any]:
        item = self.model_dump(exclude_none=True)
        for k in self.DERIVED:
            item.pop(k, None)
        owner = self.owner()
        if owner is not None:
            item["owner"] = owner
        item.update(self.index_keys())
        item["kind"] = self.KIND
        return item

    def attributes(self) -> dict[str, Any]:
        """`to_item` without the key: what an update writes to replace the stored record's attributes."""
        item = self.to_item()
        del item["pk"]
        return item

    @classmethod
    def load(cls, item: Mapping[str, Any] | None) -> Self | None:
        """The record of a stored item; None when there is none or it is of another kind."""
        if item is None or item.get("kind") != cls.KIND:
            return None
        return cls.from_item(item)

    @classmethod
    def from_item(cls, item: Mapping[str, Any]) -> Self:
        return cls.model_validate({k: v for k, v in item.items() if k not in cls.DERIVED})


class ListedRecord(Record):
    """A record listed newest/oldest first on the owner index by `owner_sk`."""

    created_at: int
    owner_sk: str = ""

    def model_post_init(self, context: Any, /) -> None:
        super().model_post_init(context)
        if not self.owner_sk:
            self.owner_sk = self.first_sort_key()

    def first_sort_key(self) -> str:
        """The listing order, fixed when the record is made (nightbatch.clock.listing_key)."""
        return listing_key(self.created_at, self.pk)

    @classmethod
    def owner_of(cls, tenant: str) -> str:
        return f"{tenant}#{cls.KIND}"


class FileRecord(ListedRecord):
    KIND = "file"
    ID_PREFIX = "file-"
    DERIVED = (*Record.DERIVED, "ttl")

    bytes: int
    filename: str
    purpose: str
    s3_key: str
    expires_at: int | None = None
    # "uploaded" while an upload's md5 awaits its check, "error" when it failed (nightbatch.files.assembly).
    status: str | None = None
    status_details: str | None = None
    parts: list[str] | None = None  # an upload not yet composed reads through its ordered parts
    part_etags: list[str] | None = None  # their ETags when the Upload was completed: the version accepted
    etag: str | None = None  # of the object at `s3_key` as written (None: a file 0.1.x made)
    md5_expected: str | None = None
    upload_id: str | None = None
    batch_id: str | None = None
    quota_bytes: int = 0  # what this file counts against the tenant's stored bytes (nightbatch.tenancy.limits)
    composed_at: int | None = None  # an upload's parts were composed into the file's object
    # Read in place from a user's bucket (nightbatch/files/user_buckets.py): `s3://` + `source_bucket` + the
    # URI's key, then its objects in order ({"key", "bytes", "etag"}, and "version_id" in a versioned bucket: the
    # version accepted, nightbatch/files/inputs.py); `s3_key` is empty, and the bytes are not ours to delete.
    source_bucket: str | None = None
    source_objects: list[dict[str, Any]] | None = None
    # Deleted through the API while open batches (held_by) read it: gone for the API, its bytes kept until
    # those batches end (nightbatch.files.service: FileService.release_held, run by the sweeper).
    deleted_at: int | None = None
    held_by: list[str] | None = None

    HELD_STATUS: ClassVar[str] = "file_held"

    def index_keys(self) -> dict[str, Any]:
        if self.deleted_at is not None:  # no TTL: the sweeper, not DynamoDB, removes it with its bytes
            return {"open_status": self.HELD_STATUS, "created_sk": sort_key(self.created_at, self.pk)}
        return {"ttl": self.expires_at} if self.expires_at is not None else {}

    def live(self, at: int) -> bool:
        return self.deleted_at is None and (self.expires_at is None or self.expires_at > at)


class BatchRecord(ListedRecord):
    KIND = "batch"
    ID_PREFIX = "batch_"

    status: str
    endpoint: str
    input_file_id: str
    completion_window: str
    # Which API made it, and so which shows it: OpenAI's /v1/batches or Anthropic's /v1/messages/batches
    # (nightbatch/messages/). Each wire answers the other's ids as unknown.
    wire: str = "openai"
    deleted_at: int | None = None  # a Message Batch deleted through the Anthropic wire (kept for usage and cost)
    expires_at: int | None = None
    request_counts: dict[str, int] = {}
    # Finalize's lines never run, by code (batch_cancelled, batch_expired, shard_failed): among `failed`, they
    # are what the Anthropic wire counts as canceled and expired rather than errored.
    unrun_counts: dict[str, int] | None = None
    metadata: dict[str, str] | None = None
    options: dict[str, Any] | None = None
    output_expires_after_seconds: int | None = None
    model: str | None = None
    errors: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    ext: dict[str, Any] | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    live_completed: int | None = None
    live_failed: int | None = None
    live_input_tokens: int | None = None
    live_output_tokens: int | None = None
    live_since: int | None = None  # when the first shard attempt that reported progress began (the ETA's start)
    # Set along the workflow: Validate's token estimate, Plan's shard count, the status Finalize is heading
    # for, and why Capacity moved the batch's remaining shards to on-demand.
    est_tokens: int | None = None
    shard_count: int | None = None
    finalize_target: str | None = None
    capacity_on_demand: str | None = None
    # Why Capacity moved the batch's remaining shards to another backend, and which: from AWS Batch to SageMaker
    # (`gpuBackend: both`), or from the model's endpoint to its GPU backend (too slow for the window). A batch
    # moved before `backend_moved_to` existed moved to SageMaker.
    backend_moved: str | None = None
    backend_moved_to: str | None = None

    def index_keys(self) -> dict[str, Any]:
        keys: dict[str, Any] = {"created_sk": sort_key(self.created_at, self.pk)}
        if self.status not in _TERMINAL:
            keys["open_status"] = self.status
        return keys


class UploadRecord(ListedRecord):
    KIND = "upload"
    ID_PREFIX = "upload_"

    bytes: int
    filename: str
    mime_type: str
    purpose: str
    status: str
    expires_at: int
    ttl: int | None = None
    parts_received: int = 0
    bytes_received: int = 0
    file_expires_after_seconds: int | None = None
    file_id: str | None = None
    part_ids: list[str] | None = None
    completed_at: int | None = None
    cancelled_at: int | None = None
    quota_bytes: int = 0  # the declared size, counted against the tenant's stored bytes (nightbatch.tenancy.limits)

    OPEN_STATUS: ClassVar[str] = "upload_pending"

    def index_keys(self) -> dict[str, Any]:
        # Sparse status index: the sweeper finds pending Uploads past their hour (UploadService.sweep_expired).
        keys: dict[str, Any] = {"created_sk": sort_key(self.created_at, self.pk)}
        if self.status == "pending":
            keys["open_status"] = self.OPEN_STATUS
        return keys


class KeyRecord(ListedRecord):
    """An API key, by the hash of the key (never the key itself)."""

    KIND = "apikey"
    ID_PREFIX = "key#"
    LIST_OWNER: ClassVar[str] = "keys#all"

    key_id: str
    name: str
    prefix: str = ""
    revoked_at: int | None = None

    def first_sort_key(self) -> str:
        return sort_key(self.created_at, self.key_id)  # the public id: the pk is the hash

    @classmethod
    def owner_of(cls, tenant: str) -> str:
        return cls.LIST_OWNER  # every tenant's keys on one listing, for `nightbatch keys list`

    @property
    def active(self) -> bool:
        return self.revoked_at is None


class PreciselyListedRecord(ListedRecord):
    """Listed to the microsecond: several are often made within one second."""

    def first_sort_key(self) -> str:
        return precise_sort_key(self.pk)


class WebhookEndpointRecord(PreciselyListedRecord):
    KIND = "webhook_endpoint"
    ID_PREFIX = "whep_"

    updated_at: int | None = None
    event_types: list[str]
    name: str
    url: str
    secret: str
    previous_secret: str | None = None
    previous_secret_expires_at: int | None = None
    secret_hint: str | None = None  # the secret is sealed (KMS) in AWS: its hint is kept beside it


class DeliveryRecord(PreciselyListedRecord):
    """One event's delivery to one webhook endpoint, with every attempt."""

    KIND = "webhook_delivery"
    ID_PREFIX = "wh_"

    endpoint_id: str
    event_id: str
    event_type: str
    batch_id: str | None = None
    body: str
    status: str
    test: bool | None = None
    attempt_count: int = 0
    attempts: list[dict[str, Any]] = []
    next_attempt_at: int | None = None
    created_ts: float | None = None
    enqueued: bool | None = None
    ttl: int | None = None

    @classmethod
    def owner_of_endpoint(cls, tenant: str, endpoint_id: str) -> str:
        return f"{tenant}#webhook_delivery#{endpoint_id}"

    def owner(self) -> str | None:
        return self.owner_of_endpoint(self.tenant, self.endpoint_id)


class EventRecord(Record):
    """A batch's terminal event, keyed by the transition (a second Notify finds the first one's event), with
    the exact body every delivery sends and what each channel did with it."""

    KIND = "event"
    ID_PREFIX = "evt#"
    # Stored as written: the sparse status index holds the event until every channel is done (`closed`).
    DERIVED = ("owner",)
    PENDING: ClassVar[str] = "notify_pending"

    event_id: str
    type: str
    batch_id: str
    status: str
    created_at: int
    body: str
    open_status: str | None = None
    created_sk: str | None = None
    sns_message_id: str | None = None
    # EventBridge's id of the terminal state-change event (notifications/state_changes.py)
    bus_event_id: str | None = None
    emailed_to: list[str] | None = None
    email_rejected: list[str] | None = None

    @staticmethod
    def pk_of(batch_id: str, status: str) -> str:
        return f"evt#{batch_id}#{status}"

    @property
    def pending(self) -> bool:
        return self.open_status == self.PENDING


class IdempotencyRecord(Record):
    """The first request with an Idempotency-Key, and the answer kept for replays."""

    KIND = "idempotency"
    ID_PREFIX = "idem#"

    fingerprint: str
    state: str
    token: str | None = None
    created_at: int
    started_at: int
    ttl: int | None = None
    status: int | None = None
    body: str | None = None
    headers: dict[str, str] | None = None
    completed_at: int | None = None


class UsageCounters(Record):
    """A tenant's queued requests/tokens and batches in flight, with one member entry per counted batch."""

    KIND = "usage"
    ID_PREFIX = "usage#"

    queued_requests: int = 0
    queued_tokens: int = 0
    batches_in_flight: int = 0
    stored_bytes: int = 0

    @staticmethod
    def pk_of(tenant: str) -> str:
        return f"usage#{tenant}"


class RateCounter(Record):
    """A tenant's API requests in one minute window."""

    KIND = "rate"
    ID_PREFIX = "rate#"

    requests: int = 0
    ttl: int | None = None

    @staticmethod
    def pk_of(tenant: str, window: int) -> str:
        return f"rate#{tenant}#{window}"


KINDS: tuple[type[Record], ...] = (
    FileRecord, BatchRecord, UploadRecord, KeyRecord, WebhookEndpointRecord, DeliveryRecord, EventRecord,
    IdempotencyRecord, UsageCounters, RateCounter,
)
