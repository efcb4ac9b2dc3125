"""Images by reference (docs/USER_BUCKETS.md): an `s3://` image URL of a chat or responses line, in an allow-listed
bucket (Validate checked it: nightbatch/validation/requests.py), becomes the `data:` URL vLLM takes, fetched here
with the worker's own role and bounded size.

Why a data: URL built here rather than a pre-signed https URL: the worker's role already holds s3:GetObject on
exactly the allow-listed buckets (infra/user_buckets.py), so vLLM needs no network path or allow-listed domain
to S3; the size bound is enforced before a byte reaches the engine (one ranged GET of at most the limit + 1
bytes); and a failure is this line's own clear error, not the engine's fetch timing out.
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Iterator
from typing import Any

from gpu_worker.engines.base import EngineReply
from nightbatch.files.user_buckets import parse_uri
from nightbatch.storage import BlobStore
from nightbatch.storage.botoerrors import client_error


class ImageError(Exception):
    """One line's image cannot be given to the engine: its result is this error (a 400)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param

    def reply(self) -> EngineReply:
        return EngineReply(status_code=400, body={"error": {
            "message": str(self), "type": "invalid_request_error", "param": self.param, "code": "invalid_image"}})


def _slots(body: dict[str, Any]) -> Iterator[tuple[dict[str, Any], str, str]]:
    """(holder, field, param) of every image URL of the body: chat `image_url` parts (`{"url": …}` or a
    string) and responses `input_image` parts (`image_url`: a string)."""
    for name in ("messages", "input"):
        items = body.get(name)
        if not isinstance(items, list):
            continue
        for i, item in enumerate(items):
            content = item.get("content") if isinstance(item, dict) else None
            for j, part in enumerate(content if isinstance(content, list) else []):
                if not isinstance(part, dict) or "image_url" not in part:
                    continue
                ref = part["image_url"]
                where = f"body.{name}[{i}].content[{j}].image_url"
                if isinstance(ref, dict):
                    yield ref, "url", where + ".url"
                else:
                    yield part, "image_url", where


def has_s3_images(body: dict[str, Any]) -> bool:
    return any(isinstance(h.get(f), str) and h[f].startswith("s3://") for h, f, _ in _slots(body))


def resolve_images(blobs: BlobStore, body: dict[str, Any], *, max_bytes: int, buckets: set[str]) -> dict[str, Any]:
    """A copy of the body with every `s3://` image URL replaced by its object as a data: URL; ImageError for an
    object outside the allow-listed `buckets` (Validate refused those already; checked again here, since the
    worker's role may read its own bucket too), missing, unreadable, or over `max_bytes`."""
    out = copy.deepcopy(body)
    for holder, field, param in _slots(out):
        url = holder.get(field)
        if isinstance(url, str) and url.startswith("s3://"):
            if parse_uri(url, param)[0] not in buckets:
                raise ImageError(f"The image {url[:200]} is not in a bucket this deployment reads images from.",
                                 param)
            holder[field] = _data_url(blobs, url, param, max_bytes)
    return out


def _data_url(blobs: BlobStore, url: str, param: str, max_bytes: int) -> str:
    bucket, key = parse_uri(url, param)
    try:
        got = blobs.in_bucket(bucket).client.get_object(Bucket=bucket, Key=key, Range=f"bytes=0-{max_bytes}")
    except client_error() as e:
        code = e.response.get("Error", {}).get("Code", "error")
        raise ImageError(f"The image {url[:200]} could not be read ({code}).", param) from e
    data = got["Body"].read(max_bytes + 1)
    size = _total(got.get("ContentRange"), len(data))
    if size > max_bytes:
        raise ImageError(f"The image {url[:200]} is {size} bytes, over the limit of {max_bytes} bytes per image.",
                         param)
    kind = str(got.get("ContentType") or "")
    kind = kind if kind.startswith("image/") else "image/" + {"jpg": "jpeg"}.get(
        key.rsplit(".", 1)[-1].lower(), key.rsplit(".", 1)[-1].lower() or "png")
    return f"data:{kind};base64,{base64.b64encode(data).decode()}"


def _total(content_range: str | None, read: int) -> int:
    """The object's size from `bytes 0-N/TOTAL`, else what was read."""
    if content_range and "/" in content_range:
        tail = content_range.rsplit("/", 1)[1]
        if tail.isdigit():
            return int(tail)
    return read
