"""Idempotency-Key records: the first request with a key claims it, its answer is kept and replayed for 24 h.

Item `idem#<tenant>#<sha256(key)>` (kind "idempotency"): the request fingerprint, `state` in_progress/done,
the stored response (status + JSON body), `created_at` and a DynamoDB `ttl`. Expiry is also checked on read,
because DynamoDB deletes expired items only eventually.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import secrets
from dataclasses import dataclass
from typing import Any

from nightbatch.aws import Table
from nightbatch.aws.records import IdempotencyRecord
from nightbatch.clock import now
from nightbatch.errors import ConflictError, InvalidRequestError, StorageConflictError

MAX_KEY_CHARS = 255


@dataclass(frozen=True)
class Claim:
    """This request owns the key and must `complete` or `abandon` it."""

    pk: str
    token: str


@dataclass(frozen=True)
class Replay:
    """The key was used before with the same request: answer with what was answered then."""

    status: int
    body: Any
    headers: dict[str, str]


class Fingerprint:
    """SHA-256 over the method, path and body, fed in pieces so that large uploads are never held whole."""

    def __init__(self, method: str, path: str) -> None:
        self._h = hashlib.sha256()
        self.update(method.upper().encode(), path.encode())

    def update(self, *parts: bytes) -> None:
        for part in parts:
            # Length-prefixed, so that moving bytes between fields cannot give the same digest.
            self._h.update(len(part).to_bytes(8, "big"))
            self._h.update(part)

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def record_pk(tenant: str, key: str) -> str:
    return f"{IdempotencyRecord.ID_PREFIX}{tenant}#{hashlib.sha256(key.encode()).hexdigest()}"


def check_key(key: str) -> str:
    if not key or len(key) > MAX_KEY_CHARS or not key.isprintable():
        raise InvalidRequestError(
            f"Invalid 'Idempotency-Key' header: use 1-{MAX_KEY_CHARS} printable characters.",
            param="Idempotency-Key", code="invalid_value",
        )
    return key


class IdempotencyStore:
    def __init__(self, table: Table, *, ttl_seconds: int, lock_seconds: int) -> None:
        self.table = table
        self.ttl_seconds = ttl_seconds
        self.lock_seconds = lock_seconds

    def begin(self, tenant: str, key: str, fingerprint: str) -> Claim | Replay:
        """Claims the key, or answers with the stored response; 409 for a reuse that cannot be answered."""
        pk = record_pk(tenant, check_key(key))
        token = secrets.token_hex(8)
        t = now()
        claim = IdempotencyRecord(pk=pk, tenant=tenant, fingerprint=fingerprint, state="in_progress", token=token,
                                  created_at=t, started_at=t, ttl=t + self.ttl_seconds)
        for _ in range(3):
            try:
                self.table.put_record(claim, new=True)
                return Claim(pk=pk, token=token)
            except StorageConflictError:
                pass
            old = self.table.get_record(IdempotencyRecord, pk)
            if old is None:
                continue  # deleted since (abandoned): claim it afresh
            if old.created_at + self.ttl_seconds <= t or old.state == "abandoned":
                if self._take_over(old, claim):
                    return Claim(pk=pk, token=token)
                continue
            if old.fingerprint != fingerprint:
                raise ConflictError(
                    f"The Idempotency-Key '{key}' was already used with a different request (another path or "
                    "body) in the last 24 hours. Use a new key for a new request.",
                    param="Idempotency-Key", code="idempotency_key_reused",
                )
            if old.state == "done":
                return Replay(status=int(old.status or 0), body=json.loads(str(old.body)),
                              headers=dict(old.headers or {}))
            if old.started_at + self.lock_seconds <= t:
                # The first request never finished (its process died): this one takes over.
                if self._take_over(old, claim):
                    return Claim(pk=pk, token=token)
                continue
            raise ConflictError(
                f"A request with the Idempotency-Key '{key}' is still being processed. "
                "Retry after it completes to get its result.",
                retry=True, param="Idempotency-Key", code="idempotency_request_in_progress",
                headers={"retry-after": "1"},
            )
        raise ConflictError(f"The Idempotency-Key '{key}' is in use by concurrent requests; retry.",
                            retry=True, param="Idempotency-Key", code="idempotency_request_in_progress",
                            headers={"retry-after": "1"})

    def _take_over(self, old: IdempotencyRecord, claim: IdempotencyRecord) -> bool:
        try:
            self.table.update_attributes(IdempotencyRecord, old.pk, set_=claim.attributes(),
                                         remove=("status", "body", "headers"), expect_in={"token": (old.token,)})
        except StorageConflictError:
            return False
        return True

    def complete(self, claim: Claim, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        """Stores the answer to replay. Only this claim's owner may write it."""
        # A conflict means the claim was taken over after its lock expired; the newer owner's answer stands.
        with contextlib.suppress(StorageConflictError):
            self.table.update_attributes(
                IdempotencyRecord, claim.pk, set_={"state": "done", "status": status, "body": json.dumps(body),
                                "headers": dict(headers or {}), "completed_at": now()},
                expect_in={"token": (claim.token,)},
            )

    def abandon(self, claim: Claim) -> None:
        """Frees the key so that a retry runs the request again (after 5xx, 429, or a retryable 409)."""
        with contextlib.suppress(StorageConflictError):
            self.table.update_attributes(IdempotencyRecord, claim.pk, set_={"state": "abandoned"},
                                         expect_in={"token": (claim.token,)})
