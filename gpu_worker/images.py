"""Images by reference (docs/USER_BUCKETS.md): an `s3://` image URL of a chat or responses line, in an allow-listed
bucket (Validate checked it: nightbatch/validation/requests.py), or a file id of the batch tenant's (Validate checked
it and tagged its object: nightbatch/validation/file_images.py), becomes the `data:` URL vLLM takes, fetched here
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
from typing import Any, TypeGuard

from gpu_worker.engines.base import EngineReply
from nightbatch.ids import is_file_id
from nightbatch.layout import file_key
from nightbatch.storage import BlobStore
from nightbatch.storage.botoerrors import client_error
from nightbatch.tenancy.scope import Scope, ScopeError


class ImageError(Exception):
    """One line's image cannot be given to the engine: its result is this error (a 400)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param

    def reply(self) -> EngineReply:
        return EngineReply(status_code=400, body={"error": {
            "message": str(self), "type": "invalid_request_error", "param": self.param, "code": "invalid_image"}})


def _slots(body: dict[str, Any]) -> Iterator[tuple[dict[str, Any], str, str]]:
    """(holder, field, param) of every image reference of the body: chat `image_url` parts (`{"url": …}` or a
    string) and responses `input_image` parts (`image_url`: a string, or `file_id`)."""
    for name in ("messages", "input"):
        items = body.get(name)
        if not isinstance(items, list):
            continue
        for i, item in enumerate(items):
            content = item.get("content") if isinstance(item, dict) else None
            for j, part in enumerate(content if isinstance(content, list) else []):
                if not isinstance(part, dict):
                    continue
                where = f"body.{name}[{i}].content[{j}]"
                if "file_id" in part and part.get("type") == "input_image":
                    yield part, "file_id", where + ".file_id"
                    continue
                if "image_url" not in part:
                    continue
                ref = part["image_url"]
                if isinstance(ref, dict):
                    yield ref, "url", where + ".image_url.url"
                else:
                    yield part, "image_url", where + ".image_url"


def _by_reference(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and (value.startswith("s3://") or is_file_id(value))


def has_images_by_reference(body: dict[str, Any]) -> bool:
    return any(_by_reference(h.get(f)) for h, f, _ in _slots(body))


def resolve_images(blobs: BlobStore, body: dict[str, Any], *, max_bytes: int, scope: Scope) -> dict[str, Any]:
    """A copy of the body with every image by reference replaced by its object as a data: URL; ImageError for an
    `s3://` object outside the shard tenant's `scope` (Validate refused those already; checked again here, since
    the worker's role may read its own bucket too, and every tenant's prefixes), or for an object missing,
    unreadable, or over `max_bytes`.
    A file id reads the file's object of the deployment's bucket (`blobs`): its key is built from the id, which
    must have the shape of ours (so a line Validate did not see cannot name another key)."""
    out = copy.deepcopy(body)
    for holder, field, param in _slots(out):
        ref = holder.get(field)
        if _by_reference(ref):
            _resolve(blobs, holder, field, ref, param, max_bytes=max_bytes, scope=scope)
    return out


def _resolve(blobs: BlobStore, holder: dict[str, Any], field: str, ref: str, param: str, *, max_bytes: int,
             scope: Scope) -> None:
    if not ref.startswith("s3://"):  # a file id
        data_url = _data_url(blobs, file_key(ref), f"The image file {ref}", param, max_bytes,
                             missing=": it was deleted, or expired, after the batch was validated")
        if field == "file_id":  # vLLM reads an input_image's image_url only
            del holder["file_id"]
            field = "image_url"
        holder[field] = data_url
        return
    try:
        uri = scope.readable(ref, param)
    except ScopeError as e:
        raise ImageError(e.message, param) from None
    holder[field] = _data_url(blobs.in_bucket(uri.bucket), uri.key, f"The image {uri}", param, max_bytes,
                              suffix=uri.key.rsplit("/", 1)[-1])


def _data_url(blobs: BlobStore, key: str, what: str, param: str, max_bytes: int, *, suffix: str = "",
              missing: str = "") -> str:
    """The object as a data: URL, read in one ranged GET of at most `max_bytes` + 1 bytes. Its media type: the
    object's own if an image's, else the name's extension (`suffix`, an s3:// key's last part), else the bytes'
    signature (a file's object is named by its id alone)."""
    try:
        got = blobs.client.get_object(Bucket=blobs.bucket, Key=key, Range=f"bytes=0-{max_bytes}")
    except client_error() as e:
        code = e.response.get("Error", {}).get("Code", "error")
        gone = missing if code in ("NoSuchKey", "404") else ""
        raise ImageError(f"{what} could not be read ({code}){gone}.", param) from e
    data = got["Body"].read(max_bytes + 1)
    size = _total(got.get("ContentRange"), len(data))
    if size > max_bytes:
        raise ImageError(f"{what} is {size} bytes, over the limit of {max_bytes} bytes per image.", param)
    kind = str(got.get("ContentType") or "")
    if not kind.startswith("image/"):
        ext = suffix.rsplit(".", 1)[-1].lower() if "." in suffix else ""
        kind = "image/" + ({"jpg": "jpeg"}.get(ext, ext) if ext else _sniffed(data))
    return f"data:{kind};base64,{base64.b64encode(data).decode()}"


# The leading bytes of the image formats vision models' processors read.
_SIGNATURES = ((b"\x89PNG\r\n\x1a\n", "png"), (b"\xff\xd8\xff", "jpeg"), (b"GIF8", "gif"), (b"BM", "bmp"),
               (b"II*\x00", "tiff"), (b"MM\x00*", "tiff"))


def _sniffed(data: bytes) -> str:
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return next((kind for sig, kind in _SIGNATURES if data.startswith(sig)), "png")


def _total(content_range: str | None, read: int) -> int:
    """The object's size from `bytes 0-N/TOTAL`, else what was read."""
    if content_range and "/" in content_range:
        tail = content_range.rsplit("/", 1)[1]
        if tail.isdigit():
            return int(tail)
    return read
