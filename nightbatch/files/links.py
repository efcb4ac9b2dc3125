"""Signed download links: nightbatch URLs that carry an HMAC instead of a Bearer key (dashboard, emails).

A browser link or an email cannot send `Authorization: Bearer`, and a pre-signed S3 URL made by a Lambda role
dies with the role's session. So a caller who may read a file gets a nightbatch URL,
`/v1/nightbatch/files/{file_id}/download?expires=…&kid=…&ak=…&sig=…`, and the download route checks the HMAC
and the expiry, then redirects to a fresh pre-signed S3 URL.

Keys: in AWS the signing keys live in a Secrets Manager secret read at run time (cached for
`key_cache_seconds`), never in a function's environment: `{"current": "k2", "k1": "…", "k2": "…"}`. Links name
the key that signed them (`kid`), and every key in the secret verifies, so rotation (add `k2`, make it current,
drop `k1` a day later) breaks no link in flight. `ak` is the id of the API key that asked for the link: once
that key is revoked, its links stop working too (e-mailed links, made by the system, carry none).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel

from nightbatch.aws import Adapters
from nightbatch.aws.records import FileRecord
from nightbatch.clock import now
from nightbatch.errors import NightbatchError
from nightbatch.files.service import FileService
from nightbatch.settings import Settings
from nightbatch.tenancy.keys import KeyStore

DOWNLOAD_PATH = "/v1/nightbatch/files/{file_id}/download"

# Used only when no `link_secret` is configured: links then verify only in the process that signed them.
_PROCESS_SECRET = secrets.token_bytes(32)


class InvalidLinkError(NightbatchError):
    """A download link whose signature does not match or whose time is up (403, as S3 answers)."""

    status = 403
    type = "invalid_request_error"
    default_code = "invalid_link"


class FileLink(BaseModel):
    """The answer of POST /v1/nightbatch/files/{file_id}/link."""

    url: str
    expires_at: int


class SignedLink(BaseModel):
    file_id: str
    expires_at: int
    kid: str
    ak: str = ""
    sig: str

    @property
    def query(self) -> dict[str, str]:
        q = {"expires": str(self.expires_at), "kid": self.kid}
        if self.ak:
            q["ak"] = self.ak
        q["sig"] = self.sig
        return q

    @property
    def path(self) -> str:
        """The link relative to the API root; prefix it with the public base URL (without `/v1`)."""
        return DOWNLOAD_PATH.format(file_id=self.file_id) + "?" + "&".join(f"{k}={v}" for k, v in self.query.items())


@dataclass(frozen=True)
class LinkKeys:
    """The key new links are signed with, and every key that still verifies (by key id)."""

    current: str
    keys: dict[str, bytes]


def parse_link_keys(raw: str) -> LinkKeys:
    """The secret's value: `{"current": kid, kid: key, …}`; a plain string is one key, id "k1"."""
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        return LinkKeys(current="k1", keys={"k1": raw.encode()})
    keys = {str(k): str(v).encode() for k, v in data.items() if k != "current" and v}
    current = str(data.get("current") or "")
    if current not in keys:
        raise ValueError("the link-signing secret names no current key among its keys")
    return LinkKeys(current=current, keys=keys)


def link_keys(settings: Settings, read_secret: Callable[[str], str] | None = None) -> LinkKeys:
    """From `link_keys_secret` (Secrets Manager, through `read_secret`), else `link_secret`, else this process's
    own key."""
    if settings.links.keys_secret and read_secret is not None:
        return parse_link_keys(read_secret(settings.links.keys_secret))
    if settings.links.secret:
        return parse_link_keys(settings.links.secret)
    return LinkKeys(current="p", keys={"p": _PROCESS_SECRET})


def _signature(secret: bytes, file_id: str, expires_at: int, kid: str, api_key_id: str) -> str:
    # The purpose prefix keeps these MACs from being valid for anything else signed with the same key.
    message = f"nightbatch-download\x1f{file_id}\x1f{expires_at}\x1f{kid}\x1f{api_key_id}".encode()
    digest = hmac.new(secret, message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def sign_link(settings: Settings, file_id: str, *, ttl_seconds: int | None = None, at: int | None = None,
              keys: LinkKeys | None = None, api_key_id: str = "") -> SignedLink:
    """A link to `file_id` for `ttl_seconds` (default `link_ttl_seconds`). Check the caller's access first."""
    keys = keys or link_keys(settings)
    ttl = ttl_seconds if ttl_seconds is not None else settings.links.ttl_seconds
    expires_at = (at if at is not None else now()) + ttl
    sig = _signature(keys.keys[keys.current], file_id, expires_at, keys.current, api_key_id)
    return SignedLink(file_id=file_id, expires_at=expires_at, kid=keys.current, ak=api_key_id, sig=sig)


def verify_link(settings: Settings, file_id: str, expires: str, sig: str, *, kid: str = "", ak: str = "",
                at: int | None = None, keys: LinkKeys | None = None) -> None:
    """Raises InvalidLinkError unless `sig` came from `sign_link` for this file and is still valid."""
    keys = keys or link_keys(settings)
    try:
        expires_at = int(expires)
    except ValueError:
        raise InvalidLinkError("This download link is not valid.") from None
    secret = keys.keys.get(kid)
    expected = _signature(secret, file_id, expires_at, kid, ak) if secret is not None else ""
    if not expected or not hmac.compare_digest(expected.encode(), sig.encode()):
        raise InvalidLinkError("This download link is not valid.")
    if (at if at is not None else now()) >= expires_at:
        raise InvalidLinkError("This download link has expired; ask for a new one.", code="link_expired")


def open_link(files: FileService, file_id: str, expires: str, sig: str, *, kid: str = "", ak: str = "",
              keys: LinkKeys | None = None) -> FileRecord:
    """The file a valid link points at; NotFoundError if the file was deleted or expired since."""
    verify_link(files.settings, file_id, expires, sig, kid=kid, ak=ak, keys=keys)
    if ak and not KeyStore(files.table).find(key_id=ak):
        raise InvalidLinkError("The API key that made this link was revoked; ask for a new link.",
                               code="link_revoked")
    # The signature stands in for the Bearer key, so the tenant comes from the file itself.
    rec = files.table.get_record(FileRecord, file_id) if file_id.startswith("file-") else None
    return files.item(rec.tenant if rec is not None else "", file_id)


def link_keys_from(adapters: Adapters) -> LinkKeys:
    """The deployment's link keys, read through the adapters' Secrets Manager reader (cached for
    `key_cache_seconds`, at least a second) when configured."""
    settings = adapters.settings
    max_age = max(1.0, settings.api.key_cache_seconds)

    def read(secret_id: str) -> str:
        return adapters.secrets.read(secret_id, max_age=max_age)

    return link_keys(settings, read if settings.links.keys_secret else None)
