"""Where a file's bytes are served from: inline through the API, or a 307 to a short-lived pre-signed S3 URL.

A Lambda response carries ~4 MiB of raw bytes (`max_inline_download_bytes`); past that the client goes
to S3.
HTTP clients drop the Authorization header on a cross-origin redirect (httpx, which the OpenAI SDK uses, and
`requests` both do), so the API key never reaches S3.
"""

from __future__ import annotations

from dataclasses import dataclass

from nightbatch.aws import BlobStore
from nightbatch.aws.records import FileRecord
from nightbatch.errors import ConflictError, InvalidRequestError
from nightbatch.settings import Settings

# The SDK honours Retry-After up to 120 s; composing a few hundred MB takes seconds.
ASSEMBLING_RETRY_AFTER_SECONDS = 5


@dataclass(frozen=True)
class Redirect:
    url: str


def locate(settings: Settings, blobs: BlobStore, item: FileRecord) -> Redirect | None:
    """None: send the bytes inline (streamed, through the upload's parts if it has not been composed yet)."""
    if item.status == "error":
        details = item.status_details or "it failed its checks."
        raise InvalidRequestError(
            f"File {item.pk} cannot be downloaded: {details}",
            param="file_id", code="file_unusable",
        )
    if not past_inline_limit(settings, item.bytes):
        return None
    if item.source_objects:
        if settings.deployment.mode == "local":
            return None
        raise InvalidRequestError(
            f"File {item.pk} is read in place from {item.filename}; download it from there.",
            param="file_id", code="file_in_user_bucket")
    if item.parts:
        if settings.deployment.mode == "local":
            return None  # no response-size limit in front of the local stack: stream through the parts
        raise ConflictError(
            f"File {item.pk} is being assembled from its upload parts; retry in a few seconds.",
            retry=True, code="file_not_ready",
            headers={"retry-after": str(ASSEMBLING_RETRY_AFTER_SECONDS)},
        )
    return _presigned(settings, blobs, item.s3_key, item.filename)


def locate_object(settings: Settings, blobs: BlobStore, key: str, size: int, filename: str) -> Redirect | None:
    """An object of ours that is no File (a Message Batch's results: nightbatch/messages/results.py), as a File's
    bytes are served: None (inline) up to the limit, else a redirect to it."""
    return _presigned(settings, blobs, key, filename) if past_inline_limit(settings, size) else None


def past_inline_limit(settings: Settings, size: int) -> bool:
    limit = settings.files.max_inline_download_bytes
    return 0 < limit < size


def _presigned(settings: Settings, blobs: BlobStore, key: str, filename: str) -> Redirect:
    return Redirect(blobs.presign_get(key, expires=settings.files.presigned_url_seconds, filename=filename))
