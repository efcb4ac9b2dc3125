"""API keys: stored as a SHA-256 hash with their tenant and name; looked up per request through a short cache.

A key is `nb-` + 43 URL-safe characters (32 random bytes). Only its hash is stored, under pk
`key#<sha256 hex>`, so a leaked table does not leak usable keys. Every key also has a listing owner
(`keys#all`) so that `nightbatch keys list` needs no scan, and a public id (`key_` + the first 16 hex digits
of the hash) that the CLI shows and `keys revoke` accepts.
"""

from __future__ import annotations

import hashlib
import logging
import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from nightbatch.aws import Table
from nightbatch.aws.records import KeyRecord
from nightbatch.clock import now
from nightbatch.errors import InvalidRequestError
from nightbatch.settings.base import comma_list

log = logging.getLogger("nightbatch.tenancy.keys")

KEY_PREFIX = "nb-"
KEY_RANDOM_BYTES = 32
LIST_OWNER = KeyRecord.LIST_OWNER
DEFAULT_TENANT = "default"
# Tenants end up inside item keys (`<tenant>#file`, `idem#<tenant>#…`), so they may not contain `#`.
TENANT_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
NAME_RE = re.compile(r"^[\x21-\x7e][\x20-\x7e]{0,63}$")
SHOWN_PREFIX_CHARS = 11  # "nb-" + 8 characters: enough to tell keys apart, far too few to guess one


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def key_pk(key_hash: str) -> str:
    return f"key#{key_hash}"


def key_id_of(key_hash: str) -> str:
    return f"key_{key_hash[:16]}"


# What new_key() makes: the prefix and token_urlsafe's unpadded base64 of KEY_RANDOM_BYTES.
STORED_KEY_RE = re.compile(rf"^{re.escape(KEY_PREFIX)}[A-Za-z0-9_-]{{{(KEY_RANDOM_BYTES * 4 + 2) // 3}}}$")


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(KEY_RANDOM_BYTES)


def check_tenant(tenant: str) -> str:
    if not TENANT_RE.fullmatch(tenant):
        raise InvalidRequestError(
            f"Invalid tenant '{tenant}': use 1-63 lowercase letters, digits, '-' or '_', starting with a "
            "letter or digit.", param="tenant",
        )
    return tenant


class KeyStore:
    def __init__(self, table: Table) -> None:
        self.table = table

    def create(self, *, name: str, tenant: str = DEFAULT_TENANT) -> tuple[str, KeyRecord]:
        """Makes a key; the plain key is returned here and never again."""
        check_tenant(tenant)
        if not NAME_RE.fullmatch(name):
            raise InvalidRequestError(f"Invalid key name '{name}': use 1-64 printable ASCII characters.",
                                      param="name")
        for rec in self.list_keys():
            if rec.active and rec.name == name:
                raise InvalidRequestError(
                    f"An active key named '{name}' already exists ({rec.key_id}, tenant '{rec.tenant}'); "
                    "choose another name or revoke that key first.", param="name",
                )
        key = new_key()
        digest = hash_key(key)
        created = now()
        rec = KeyRecord(pk=key_pk(digest), key_id=key_id_of(digest), tenant=tenant, name=name,
                        prefix=key[:SHOWN_PREFIX_CHARS], created_at=created)
        self.table.put_record(rec, new=True)
        return key, rec

    def lookup(self, key: str) -> KeyRecord | None:
        """The active record for a presented key, or None (unknown, revoked or malformed)."""
        if not key.startswith(KEY_PREFIX) or len(key) > 256:
            return None
        rec = self.table.get_record(KeyRecord, key_pk(hash_key(key)))
        return rec if rec is not None and rec.active else None

    def list_keys(self) -> list[KeyRecord]:
        return list(self.table.records(KeyRecord, LIST_OWNER, ascending=True))

    def find(self, *, key_id: str | None = None, name: str | None = None,
             prefix: str | None = None) -> list[KeyRecord]:
        """Active keys matching a public id, a name, or the start of the key (or the whole key)."""
        if prefix and len(prefix) > SHOWN_PREFIX_CHARS and prefix.startswith(KEY_PREFIX):
            # A whole key: look it up by hash rather than by its shown prefix.
            rec = self.lookup(prefix)
            return [rec] if rec is not None else []
        out = []
        for rec in self.list_keys():
            if not rec.active:
                continue
            if ((key_id and rec.key_id == key_id) or (name and rec.name == name)
                    or (prefix and rec.prefix.startswith(prefix))):
                out.append(rec)
        return out

    def revoke(self, rec: KeyRecord) -> KeyRecord:
        return self.table.update_record(KeyRecord, rec.pk, set_={"revoked_at": now()})


class KeyCache:
    """Per-process memo of key lookups, so most requests cost no table read.

    Only hits are cached: a key created a moment ago works at once, and a revoked one stops working within
    `ttl` seconds. Bounded, least recently used first out.
    """

    def __init__(self, store: KeyStore, *, ttl: float, max_entries: int = 10_000) -> None:
        self.store = store
        self.ttl = ttl
        self.max_entries = max_entries
        self._entries: OrderedDict[str, tuple[float, KeyRecord]] = OrderedDict()
        self._lock = threading.Lock()

    def lookup(self, key: str) -> KeyRecord | None:
        digest = hash_key(key)
        t = time.monotonic()
        if self.ttl > 0:
            with self._lock:
                hit = self._entries.get(digest)
                if hit is not None and hit[0] > t:
                    self._entries.move_to_end(digest)
                    return hit[1]
        rec = self.store.lookup(key)
        if rec is not None and self.ttl > 0:
            with self._lock:
                self._entries[digest] = (t + self.ttl, rec)
                self._entries.move_to_end(digest)
                while len(self._entries) > self.max_entries:
                    self._entries.popitem(last=False)
        return rec


class BootstrapKeys:
    """The configured keys (tenant "default"): NIGHTBATCH_API_KEY(S), plus the deployment's Secrets Manager
    secret (comma-separated keys). `read_secret` caches the value for `ttl` seconds (Powertools' Parameters,
    nightbatch/aws/secrets.py), so that a rotation is picked up within `ttl`.

    A secret that cannot be read is logged and counts as empty for `ttl` seconds: stored keys keep working
    meanwhile, and a failing Secrets Manager is not asked again on every request (Parameters caches only
    values, not failures).
    """

    def __init__(self, configured: set[str], read_secret: Callable[[], str] | None, *, ttl: float) -> None:
        self.configured = configured
        self.read_secret = read_secret
        self.ttl = ttl
        self._failed_until = 0.0

    def current(self) -> set[str]:
        if self.read_secret is None:
            return self.configured
        t = time.monotonic()
        if self._failed_until > t:
            return self.configured
        try:
            raw = self.read_secret()
        except Exception:
            log.exception("cannot read the API keys secret; only stored and environment keys are accepted")
            self._failed_until = t + self.ttl
            return self.configured
        return self.configured | set(comma_list(raw))
