"""Signed download links for emails: nightbatch URLs whose HMAC is checked before a fresh pre-signed S3 redirect.

A pre-signed S3 URL made by a Lambda role lasts only as long as the role's session (hours), far shorter than an
email is read; the link therefore names the API, which signs a new S3 URL on every click.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from urllib.parse import urlencode

from nightbatch.errors import NightbatchError
from nightbatch.settings import Settings


class LinkSignatureError(NightbatchError):
    """The link was altered, signed with another key, or has expired."""

    status = 403
    type = "invalid_request_error"
    default_code = "invalid_signature"


def link_signature(secret: str, file_id: str, expires: int) -> str:
    mac = hmac.new(secret.encode(), f"download\x1f{file_id}\x1f{expires}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()


def base_url(settings: Settings) -> str:
    base = settings.public_base_url.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


def download_link(settings: Settings, file_id: str, *, expires: int) -> str | None:
    """None when links are not configured (no secret or no public base URL)."""
    if not settings.link_secret or not settings.public_base_url:
        return None
    query = urlencode({"expires": expires, "sig": link_signature(settings.link_secret, file_id, expires)})
    return f"{base_url(settings)}/v1/nightbatch/files/{file_id}/download?{query}"


def verify_link(settings: Settings, file_id: str, expires: int, sig: str) -> None:
    if not settings.link_secret:
        raise LinkSignatureError("Download links are not enabled on this deployment.")
    expected = link_signature(settings.link_secret, file_id, expires)
    if not hmac.compare_digest(expected.encode(), sig.encode()):
        raise LinkSignatureError("This download link is not valid.", param="sig")
    if expires < time.time():
        raise LinkSignatureError("This download link has expired. Download the file with the API "
                                 f"(GET /v1/files/{file_id}/content) instead.", param="expires", code="link_expired")
