"""Signed download links: nightbatch URLs that carry an HMAC instead of a Bearer key (dashboard, emails).

A browser link or an email cannot send `Authorization: Bearer`, and a pre-signed S3 URL made by a Lambda role
dies with the role's session. So a caller who may read a file gets a nightbatch URL,
`/v1/nightbatch/files/{file_id}/download?expires=…&sig=…`, and the download route checks the HMAC and the
expiry, then redirects to a fresh pre-signed S3 URL.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

from pydantic import BaseModel

from nightbatch.clock import now
from nightbatch.errors import NightbatchError
from nightbatch.files import FileService
from nightbatch.settings import Settings
from nightbatch.storage.records import FileRecord

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
    sig: str

    @property
    def path(self) -> str:
        """The link relative to the API root; prefix it with the public base URL (without `/v1`)."""
        return DOWNLOAD_PATH.format(file_id=self.file_id) + f"?expires={self.expires_at}&sig={self.sig}"


def _secret(settings: Settings) -> bytes:
    return settings.link_secret.encode() if settings.link_secret else _PROCESS_SECRET


def _signature(secret: bytes, file_id: str, expires_at: int) -> str:
    # The purpose prefix keeps these MACs from being valid for anything else signed with the same key.
    message = f"nightbatch-download\x1f{file_id}\x1f{expires_at}".encode()
    digest = hmac.new(secret, message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def sign_link(settings: Settings, file_id: str, *, ttl_seconds: int | None = None,
              at: int | None = None) -> SignedLink:
    """A link to `file_id` for `ttl_seconds` (default `link_ttl_seconds`). Check the caller's access first."""
    ttl = ttl_seconds if ttl_seconds is not None else settings.link_ttl_seconds
    expires_at = (at if at is not None else now()) + ttl
    return SignedLink(file_id=file_id, expires_at=expires_at,
                      sig=_signature(_secret(settings), file_id, expires_at))


def verify_link(settings: Settings, file_id: str, expires: str, sig: str, *, at: int | None = None) -> None:
    """Raises InvalidLinkError unless `sig` came from `sign_link` for this file and is still valid."""
    try:
        expires_at = int(expires)
    except ValueError:
        raise InvalidLinkError("This download link is not valid.") from None
    expected = _signature(_secret(settings), file_id, expires_at)
    if not hmac.compare_digest(expected.encode(), sig.encode()):
        raise InvalidLinkError("This download link is not valid.")
    if (at if at is not None else now()) >= expires_at:
        raise InvalidLinkError("This download link has expired; ask for a new one.", code="link_expired")


def open_link(files: FileService, file_id: str, expires: str, sig: str) -> FileRecord:
    """The file a valid link points at; NotFoundError if the file was deleted or expired since."""
    verify_link(files.settings, file_id, expires, sig)
    # The signature stands in for the Bearer key, so the tenant comes from the file itself.
    rec = files.table.get_record(FileRecord, file_id)
    return files.item(rec.tenant if rec is not None else "", file_id)
