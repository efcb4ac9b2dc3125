"""The images of a line as the engine takes them: the worker's side of nightbatch/validation/media.py.

Every media reference of a line is checked again with Validate's own rules (the same walker and checks, the shard
tenant's scope), so a line Validate never saw (a hand-written segment, an input rewritten after Validate) can name
nothing Validate would refuse. An image by reference (an `s3://` object of an allow-listed bucket, or a file id of
the shard's tenant: its object's tenant tag says so, tenancy/scope.py) becomes the `data:` URL vLLM takes, fetched
here with the worker's own role: each distinct object once a line, within the per-image and per-line bounds, and
within the worker's byte budget for the lines in flight (a line waits for its share).

Why a data: URL built here rather than a pre-signed https URL: the worker's role already holds s3:GetObject on
exactly the allow-listed buckets (infra/user_buckets.py), so vLLM needs no network path or allow-listed domain
to S3 (it is started with the allowed media domains only: gpu_worker/engines/vllm_args.py); the size bounds hold
before a byte reaches the engine (a HEAD, then one ranged GET of that many bytes, of that ETag); and a failure is
this line's own clear error, not the engine's fetch timing out. A transient one (throttling, a 5xx, a reset or a
timeout) is tried again a bounded number of times first.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from gpu_worker.engines.base import EngineReply
from nightbatch.aws import BlobStore
from nightbatch.aws.botoerrors import client_error, transient
from nightbatch.errors import openai_error
from nightbatch.layout import file_key
from nightbatch.settings import Settings
from nightbatch.tenancy.scope import Scope, is_s3_uri
from nightbatch.validation.invalid import LineInvalid
from nightbatch.validation.media import MediaRef, check_references, references

T = TypeVar("T")
OWNERS_CACHED = 4096  # file ids whose tenant this shard has read (a few logos or examples, usually)


class ImageError(Exception):
    """One line's image cannot be given to the engine: its result is this error (a 400, or a 503 when S3 kept
    failing)."""

    def __init__(self, message: str, param: str, *, code: str = "invalid_image", status: int = 400) -> None:
        super().__init__(message)
        self.param, self.code, self.status = param, code, status

    def reply(self) -> EngineReply:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return EngineReply(status_code=self.status, body=openai_error(str(self), type_=kind, param=self.param,
                                                                      code=self.code))


class ByteBudget:
    """Bytes the lines in flight may hold at once, shared by them: a line waits for its share, first come first
    served, and is never refused for want of it (`fits` says whether it ever can be served). 0: no bound."""

    def __init__(self, total: int) -> None:
        self.total = max(0, total)
        self.free = self.total
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()

    def fits(self, n: int) -> bool:
        return not self.total or n <= self.total

    @asynccontextmanager
    async def hold(self, n: int) -> AsyncIterator[None]:
        if not self.total or not n:
            yield
            return
        await self._acquire(n)
        try:
            yield
        finally:
            self._release(n)

    async def _acquire(self, n: int) -> None:
        if not self._waiting and self.free >= n:
            self.free -= n
            return
        granted = asyncio.get_running_loop().create_future()
        self._waiting.append((n, granted))
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self._release(n)  # granted just as the line was cancelled: give it back
            else:
                self._waiting.remove((n, granted))
                self._wake()  # the line behind it may fit now
            raise

    def _release(self, n: int) -> None:
        self.free += n
        self._wake()

    def _wake(self) -> None:
        while self._waiting and self._waiting[0][0] <= self.free:
            n, granted = self._waiting.popleft()
            self.free -= n
            granted.set_result(None)


@dataclass
class _Object:
    """One distinct object a line names as an image, as a HEAD found it."""

    store: BlobStore
    key: str
    what: str  # "The image s3://…", "The image file file-…": how errors name it
    param: str  # where the line first names it
    suffix: str = ""  # the key's last part, whose extension may name the media type
    missing: str = ""  # what a NoSuchKey means, said after it
    size: int = 0
    etag: str = ""
    content_type: str = ""


class LineImages:
    """The image references of one shard's lines, for its tenant: checked, fetched and held within the bounds."""

    def __init__(self, blobs: BlobStore, settings: Settings, scope: Scope, *, budget: ByteBudget | None = None
                 ) -> None:
        self.blobs, self.settings, self.scope = blobs, settings, scope
        self.budget = budget or ByteBudget(settings.worker.image_bytes_in_flight)
        self._owners: OrderedDict[str, bool] = OrderedDict()  # file id -> its object names this shard's tenant

    def check(self, file_id: str, param: str) -> int:
        """validation/media.py's check of a file id, as the worker makes it: the id's shape was checked there; whose
        file it is, is read from its object's tags before it is fetched (`_owned`). Its size: not known yet."""
        return 0

    @asynccontextmanager
    async def resolved(self, endpoint: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """The body as the engine gets it (the line's own when it names no image by reference, else a copy with
        each such image a data: URL), its image bytes held from the worker's budget until the block ends. An
        ImageError when a reference breaks a rule, or its object cannot be used."""
        try:
            refs = check_references(self.settings, endpoint, body, self)
        except LineInvalid as e:
            code, message, param = e.error
            raise ImageError(message, param or "body", code=code) from None
        named: dict[str, MediaRef] = {}
        for ref in refs:
            if ref.by_reference:
                named.setdefault(ref.value, ref)  # a repeated reference: fetched, and held, once
        if not named:
            yield body
            return
        objects = await asyncio.to_thread(self._located, named)
        total = sum(o.size for o in objects.values())
        if not self.budget.fits(total):
            raise ImageError(f"The images this request names total {total} bytes, more than this worker holds for "
                             f"images at once ({self.budget.total} bytes).", next(iter(named.values())).param,
                             code="image_too_large")
        async with self.budget.hold(total):
            yield await asyncio.to_thread(self._fetched, endpoint, body, objects)

    def _located(self, named: dict[str, MediaRef]) -> dict[str, _Object]:
        """Each distinct object, found (a HEAD) and within the per-image and per-line bounds."""
        v = self.settings.validation
        objects: dict[str, _Object] = {}
        total = 0
        for value, ref in named.items():
            obj = self._object(value, ref.param)
            self._head(obj)
            if obj.size == 0:
                raise ImageError(f"{obj.what} is empty.", obj.param)
            if obj.size > v.max_image_bytes:
                raise ImageError(f"{obj.what} is {obj.size} bytes, over the limit of {v.max_image_bytes} bytes per "
                                 "image.", obj.param)
            total += obj.size
            if v.max_image_bytes_per_request and total > v.max_image_bytes_per_request:
                raise ImageError(f"The images this request names total {total} bytes (each counted once), over the "
                                 f"limit of {v.max_image_bytes_per_request} bytes per request.", obj.param,
                                 code="image_too_large")
            objects[value] = obj
        return objects

    def _head(self, obj: _Object) -> None:
        head = self._call(obj, lambda: obj.store.client.head_object(Bucket=obj.store.bucket, Key=obj.key))
        obj.size, obj.etag = int(head["ContentLength"]), str(head.get("ETag", ""))
        obj.content_type = str(head.get("ContentType") or "")

    def _object(self, value: str, param: str) -> _Object:
        if is_s3_uri(value):
            uri = self.scope.readable(value, param)  # checked with the line; here for its bucket and key
            return _Object(self.blobs.in_bucket(uri.bucket), uri.key, f"The image {uri}", param,
                           suffix=uri.key.rsplit("/", 1)[-1])
        obj = _Object(self.blobs, file_key(value), f"The image file {value}", param,
                      missing=": it was deleted, or expired, after the batch was validated")
        if not self._owned(value, obj):
            # Another tenant's file (a line Validate never saw) reads as none, as the Files API words it.
            raise ImageError(f"No such File object: {value}", param)
        return obj

    def _owned(self, file_id: str, obj: _Object) -> bool:
        """Whether the file's object was stored for this shard's tenant (its tenant tag: scope.owns)."""
        owned = self._owners.get(file_id)
        if owned is None:
            def tag_set() -> list[dict[str, str]]:
                try:
                    tags: list[dict[str, str]] = obj.store.client.get_object_tagging(
                        Bucket=obj.store.bucket, Key=obj.key)["TagSet"]
                except client_error() as e:
                    if _code(e) in ("AccessDenied", "403"):
                        return []  # not tagged as a batch's input: the worker's role may not read it at all
                    raise
                return tags

            owned = self.scope.owns({t["Key"]: t["Value"] for t in self._call(obj, tag_set)})
            self._owners[file_id] = owned
            if len(self._owners) > OWNERS_CACHED:
                self._owners.popitem(last=False)
        return owned

    def _fetched(self, endpoint: str, body: dict[str, Any], objects: dict[str, _Object]) -> dict[str, Any]:
        urls = {value: self._data_url(obj) for value, obj in objects.items()}
        out = copy.deepcopy(body)
        for ref in references(endpoint, out):
            if ref.by_reference:
                ref.replace(urls[ref.value])
        return out

    def _data_url(self, obj: _Object) -> str:
        """The object as a data: URL, read in one ranged GET of the size and ETag its HEAD found. Its media type:
        the object's own if an image's, else the name's extension (an s3:// key's last part), else the bytes'
        signature (a file's object is named by its id alone)."""
        def read() -> bytes:
            got = obj.store.client.get_object(Bucket=obj.store.bucket, Key=obj.key, Range=f"bytes=0-{obj.size - 1}",
                                              IfMatch=obj.etag)
            data: bytes = got["Body"].read(obj.size + 1)
            if len(data) != obj.size:  # the body ended early: as a connection cut short, worth another try
                raise ConnectionAbortedError(f"read {len(data)} of {obj.size} bytes")
            return data

        data = self._call(obj, read)
        kind = obj.content_type
        if not kind.startswith("image/"):
            ext = obj.suffix.rsplit(".", 1)[-1].lower() if "." in obj.suffix else ""
            kind = "image/" + ({"jpg": "jpeg"}.get(ext, ext) if ext else _sniffed(data))
        return f"data:{kind};base64,{base64.b64encode(data).decode()}"

    def _call(self, obj: _Object, call: Callable[[], T]) -> T:
        """`call()`, tried again after a transient failure (with backoff, a bounded number of times); any other
        failure of S3's is the line's 400 naming the object and S3's code."""
        worker = self.settings.worker
        attempts = max(1, worker.image_fetch_attempts)
        for attempt in range(1, attempts + 1):
            try:
                return call()
            except Exception as e:
                if transient(e):
                    if attempt < attempts:
                        time.sleep(worker.image_fetch_backoff_seconds * 2 ** (attempt - 1))
                        continue
                    raise ImageError(f"{obj.what} could not be read: S3 failed {attempts} times ({_code(e)}). "
                                     "Retry the line later.", obj.param, code="image_unavailable", status=503) from e
                if not isinstance(e, client_error()):
                    raise
                code = _code(e)
                code = "NoSuchKey" if code in ("404", "NotFound") else code  # a HEAD's answer has no body
                if code in ("PreconditionFailed", "412"):
                    raise ImageError(f"{obj.what} changed while it was being read.", obj.param) from e
                gone = obj.missing if code == "NoSuchKey" else ""
                raise ImageError(f"{obj.what} could not be read ({code}){gone}.", obj.param) from e
        raise AssertionError("unreachable")


def _code(e: Exception) -> str:
    """S3's error code, or the exception's class name for a failure that has none (a timeout, a reset)."""
    response = getattr(e, "response", None)
    code = response.get("Error", {}).get("Code") if isinstance(response, dict) else None
    return str(code or type(e).__name__)


# The leading bytes of the image formats vision models' processors read.
_SIGNATURES = ((b"\x89PNG\r\n\x1a\n", "png"), (b"\xff\xd8\xff", "jpeg"), (b"GIF8", "gif"), (b"BM", "bmp"),
               (b"II*\x00", "tiff"), (b"MM\x00*", "tiff"))


def _sniffed(data: bytes) -> str:
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return next((kind for sig, kind in _SIGNATURES if data.startswith(sig)), "png")
