"""Tenant scope: may this tenant touch this object. The one owner of the rule (docs/TENANCY.md, docs/USER_BUCKETS.md).

Every path that names an object on a tenant's behalf asks here: create (`nightbatch.input_uri`, `output_uri`),
Validate (`s3://` images), the GPU worker (the input's objects and images, before it reads them) and Finalize (the
output copies). Nothing else parses an `s3://` URI a user sent, and nothing else reads the allow-lists.

The allow-lists (cdk.json `userBuckets.read` / `.write`; `NIGHTBATCH_USER_INPUT_BUCKETS` /
`NIGHTBATCH_USER_OUTPUT_PREFIXES` locally) hold entries of three shapes:

    my-bucket                         the whole bucket, shared by every tenant (the original form)
    s3://my-bucket/shared/prefix/     that prefix, shared by every tenant
    s3://lake/teams/{tenant}/         for tenant `team-a`, s3://lake/teams/team-a/ only

A URI is in scope when it lies under an entry as expanded for the calling tenant. A parent of an entry is not
(`s3://lake/teams/` does not lie under `s3://lake/teams/team-a/`), nor another tenant's expansion. The URI must
be a plain S3 name: no dot segments (`.`, `..`, percent-encoded or not), no empty segment (`//`), no control
characters, no `*`, valid UTF-8, a key of at most 1,024 bytes, and never the deployment's own bucket.

Objects of the deployment's bucket that a shard reads on a tenant's behalf (inputs, Upload parts, images by file
id) carry their tenant as an object tag (TENANT_TAG_KEY); the worker checks it against the shard's tenant before
it uses the object (`owns`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import unquote

from nightbatch.errors import InvalidRequestError
from nightbatch.settings import Settings
from nightbatch.settings.base import comma_list

SCHEME = "s3://"
TENANT_SEGMENT = "{tenant}"
MAX_KEY_BYTES = 1024  # S3's limit on a key's UTF-8 length
# S3's bucket naming rules (general purpose buckets): 3-63 characters, lowercase letters, digits, dots, hyphens.
BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# The object tag naming the tenant an object of ours was stored for (uploads/, files/): the worker reads an
# object on a shard's behalf only when it names the shard's tenant.
TENANT_TAG_KEY = "nightbatch-tenant"
NOT_ALLOWED = "bucket_not_allowed"
# The stack output listing the allow-lists (JSON {"read": [...], "write": [...]}): `nightbatch doctor` names the
# entries every tenant shares from it (nightbatch/cli/doctor/sharing.py).
STACK_OUTPUT = "UserBuckets"


class ScopeError(InvalidRequestError):
    """A URI this tenant may not use here (or not an S3 URI at all): a 400 naming the parameter."""


@dataclass(frozen=True)
class S3Uri:
    bucket: str
    key: str  # "" (the whole bucket) or ending in "/" names a prefix

    def __str__(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.key}"

    @property
    def is_prefix(self) -> bool:
        return not self.key or self.key.endswith("/")

    def as_prefix(self) -> S3Uri:
        """This URI as a prefix: a key not ending in "/" gets one (`s3://b/out` -> `s3://b/out/`)."""
        return self if self.is_prefix else S3Uri(self.bucket, self.key + "/")

    def under(self, prefix: S3Uri) -> bool:
        return self.bucket == prefix.bucket and self.key.startswith(prefix.key)


def is_s3_uri(value: object) -> bool:
    return isinstance(value, str) and value.startswith(SCHEME)


def _shown(value: str) -> str:
    """A user's URI quoted in an error: cut short, and with whatever cannot be printed escaped."""
    text = value[:200].encode("utf-8", "backslashreplace").decode("utf-8")
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def parse_s3_uri(value: object, param: str) -> S3Uri:
    """`s3://bucket/key` as (bucket, key); a ScopeError (400 `invalid_value`) naming `param` for anything that is
    not a plain S3 name (see the module's docstring). The one parser of an `s3://` URI."""
    if not isinstance(value, str) or not value.startswith(SCHEME):
        raise ScopeError(f"Invalid '{param}': expected an 's3://bucket/key' URI.", param=param, code="invalid_value")

    def bad(why: str) -> ScopeError:
        return ScopeError(f"Invalid '{param}': '{_shown(value)}' is not a usable S3 URI ({why}).", param=param,
                          code="invalid_value")

    try:
        encoded = value.encode("utf-8")
    except UnicodeEncodeError:
        raise bad("it is not valid UTF-8") from None
    if len(encoded) > len(SCHEME) + 63 + 1 + MAX_KEY_BYTES:
        raise bad(f"a key is at most {MAX_KEY_BYTES} bytes")
    if _CONTROL.search(value):
        raise bad("it holds a control character")
    bucket, _, key = value[len(SCHEME):].partition("/")
    if not BUCKET_RE.fullmatch(bucket) or ".." in bucket:
        raise bad("not a bucket name")
    if len(key.encode("utf-8")) > MAX_KEY_BYTES:
        raise bad(f"a key is at most {MAX_KEY_BYTES} bytes")
    if "*" in key:
        raise bad("'*' is not allowed")
    segments = key.split("/")
    if any(not s for s in segments[:-1]):
        raise bad("an empty path segment ('//')")
    if any(_decoded(s) in (".", "..") for s in segments):
        raise bad("a '.' or '..' path segment")
    return S3Uri(bucket, key)


def _decoded(segment: str) -> str:
    """A segment with its percent-escapes undone until nothing changes (`%252e` -> `%2e` -> `.`)."""
    for _ in range(4):
        plain = unquote(segment)
        if plain == segment:
            break
        segment = plain
    return segment


@dataclass(frozen=True)
class AllowEntry:
    """One allow-list entry: a bucket and a key prefix ("" or ending in "/") that may hold one `{tenant}`
    segment."""

    bucket: str
    prefix: str

    @property
    def per_tenant(self) -> bool:
        return TENANT_SEGMENT in self.prefix

    def for_tenant(self, tenant: str) -> S3Uri:
        return S3Uri(self.bucket, self.prefix.replace(TENANT_SEGMENT, tenant))

    def __str__(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.prefix}"


def parse_entry(entry: str) -> AllowEntry:
    """A bare bucket name (the whole bucket) or `s3://bucket/prefix/`, whose prefix may hold one whole `{tenant}`
    segment; ValueError naming the entry otherwise."""
    text = entry.strip()
    if not text.startswith(SCHEME):
        if not BUCKET_RE.fullmatch(text):
            raise ValueError(f"{entry!r} is neither a bucket name nor an s3://bucket/prefix/ URI")
        return AllowEntry(text, "")
    try:
        uri = parse_s3_uri(text.replace(TENANT_SEGMENT, "tenant"), "allow-list")
    except ScopeError as e:
        raise ValueError(f"{entry!r}: {e.message}") from None
    prefix = text[len(SCHEME) + len(uri.bucket) + 1:]
    prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
    segments = prefix.split("/")
    if prefix.count(TENANT_SEGMENT) > 1 or any(TENANT_SEGMENT in s and s != TENANT_SEGMENT for s in segments):
        raise ValueError(f"{entry!r}: '{TENANT_SEGMENT}' must be one whole path segment, at most once")
    return AllowEntry(uri.bucket, prefix)


@lru_cache(maxsize=32)
def allow_list(raw: str) -> tuple[AllowEntry, ...]:
    """A comma-separated allow-list setting as its entries, parsed once per distinct value."""
    return tuple(parse_entry(x) for x in comma_list(raw))


@dataclass(frozen=True)
class Scope:
    """What one tenant may read and write in the users' buckets, and which of our objects are its own."""

    tenant: str
    read: tuple[AllowEntry, ...]
    write: tuple[AllowEntry, ...]
    own_bucket: str  # the deployment's bucket: never named by a user's URI

    @classmethod
    def of(cls, settings: Settings, tenant: str) -> Scope:
        """The tenant's scope under the deployment's allow-lists (`files.user_input_buckets`, `user_output_prefixes`,
        each parsed once per distinct value)."""
        return cls(tenant, allow_list(settings.files.user_input_buckets),
                   allow_list(settings.files.user_output_prefixes), settings.deployment.bucket)

    def readable(self, value: object, param: str) -> S3Uri:
        """The URI, if this tenant may read it (an object, or every object under a prefix); else a ScopeError."""
        uri = self._parsed(value, param)
        if not self._allowed(uri, self.read):
            raise self._refused(uri, param, "read batch inputs and images from", self.read)
        return uri

    def writable(self, value: object, param: str) -> S3Uri:
        """The URI as a prefix, if this tenant may write under it; else a ScopeError."""
        uri = self._parsed(value, param).as_prefix()
        if not self._allowed(uri, self.write):
            raise self._refused(uri, param, "write batch outputs to", self.write)
        return uri

    def may_read(self, bucket: str, key: str) -> bool:
        """The worker's check before it reads an object of a user's bucket."""
        return bucket != self.own_bucket and self._allowed(S3Uri(bucket, key), self.read)

    def may_write(self, bucket: str, key: str) -> bool:
        return bucket != self.own_bucket and self._allowed(S3Uri(bucket, key), self.write)

    def owns(self, tags: dict[str, str]) -> bool:
        """An object of ours whose tags say it was stored for this tenant."""
        return tags.get(TENANT_TAG_KEY) == self.tenant

    def _parsed(self, value: object, param: str) -> S3Uri:
        uri = parse_s3_uri(value, param)
        if uri.bucket == self.own_bucket:
            raise ScopeError(f"Invalid '{param}': '{_shown(str(value))}' names the deployment's own bucket, which "
                             "no batch may name.", param=param, code=NOT_ALLOWED)
        return uri

    def _allowed(self, uri: S3Uri, entries: tuple[AllowEntry, ...]) -> bool:
        return any(uri.under(e.for_tenant(self.tenant)) for e in entries)

    def _refused(self, uri: S3Uri, param: str, verb: str, entries: tuple[AllowEntry, ...]) -> ScopeError:
        return ScopeError(
            f"Invalid '{param}': '{_shown(str(uri))}' is not under a location this deployment lets tenant "
            f"'{self.tenant}' {verb} (cdk.json userBuckets; docs/USER_BUCKETS.md)."
            + ("" if entries else " This deployment lists none."), param=param, code=NOT_ALLOWED)


def tenant_tags(tenant: str) -> dict[str, str]:
    """The tag every object of ours stored for a tenant carries (uploads, Upload parts, composed files)."""
    return {TENANT_TAG_KEY: tenant}
