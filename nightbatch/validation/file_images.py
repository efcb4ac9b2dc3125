"""Images by file id (docs/USER_BUCKETS.md): a line's image may name a file the batch's tenant uploaded through the
Files API with purpose "vision" or "user_data". Validate checks each such file here, where its size is known; the
worker reads its bytes (gpu_worker/images.py).

Why a cache: an OCR or captioning batch names the same few files (a logo, a few-shot example) on many lines, and
each lookup is a table read; each distinct id is looked up once, within a bound, so memory stays flat however many
distinct files a big batch names (one evicted is looked up again, which costs a read, not a wrong answer).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

from nightbatch.tenancy.scope import Scope, ScopeError
from nightbatch.validation.requests import LineInvalid

IMAGE_PURPOSES = ("vision", "user_data")
CACHED_IDS = 4096


class ImageFileRecord(Protocol):
    """What Validate reads of a file (a storage FileRecord): its size, purpose, and whether its bytes are ours and
    in one object yet (an Upload still in parts is not; a file read in place from a user's bucket never is)."""

    bytes: int
    purpose: str
    parts: list[str] | None
    source_objects: list[dict[str, object]] | None


class FileImages:
    """The images a batch names by file id. `lookup` answers the batch tenant's live file, or None for a missing,
    expired or deleted one and for another tenant's alike (so its existence never shows). `accepted` runs once
    per file that passed, while its result is cached: Validate tags the object there, for the worker to read."""

    def __init__(self, lookup: Callable[[str], ImageFileRecord | None], *, max_bytes: int,
                 accepted: Callable[[str], None] | None = None, cached: int = CACHED_IDS,
                 scope: Scope | None = None) -> None:
        self._lookup, self._accepted, self.max_bytes, self._cached = lookup, accepted, max_bytes, cached
        self.scope = scope  # the batch tenant's: which s3:// images it may name (nightbatch/tenancy/scope.py)
        self._known: OrderedDict[str, tuple[str, str] | None] = OrderedDict()  # id -> the error, or None: fine
        self.lookups = 0

    def check(self, file_id: str, param: str) -> None:
        """A LineInvalid naming `param` unless the file is one this batch may use as an image."""
        if file_id in self._known:
            self._known.move_to_end(file_id)
            error = self._known[file_id]
        else:
            self.lookups += 1
            error = self._verdict(file_id)
            self._known[file_id] = error
            if len(self._known) > self._cached:
                self._known.popitem(last=False)
            if error is None and self._accepted is not None:
                self._accepted(file_id)
        if error is not None:
            raise LineInvalid(error[0], error[1], param)

    def check_s3(self, url: str, param: str) -> None:
        """A LineInvalid naming `param` unless the tenant may read the `s3://` image `url`."""
        if self.scope is None:
            raise LineInvalid("invalid_value", "Images by s3:// URI are not accepted here: send the image as a data: "
                              "URL.", param)
        try:
            self.scope.readable(url, param)
        except ScopeError as e:
            raise LineInvalid(e.code or "invalid_value", e.message, param) from None

    def _verdict(self, file_id: str) -> tuple[str, str] | None:
        rec = self._lookup(file_id)
        if rec is None:
            return "file_not_found", f"No such File object: {file_id}"  # the Files API's words
        if rec.purpose not in IMAGE_PURPOSES:
            return "invalid_value", (f"The file {file_id} has purpose '{rec.purpose}': an image a line names by "
                                     "file id must be uploaded with purpose 'vision' or 'user_data'.")
        if rec.source_objects:
            return "invalid_value", (f"The file {file_id} is read in place from a user's bucket: name its object "
                                     "as an s3:// image instead.")
        if rec.parts:
            return "file_not_ready", (f"The file {file_id} is still being assembled from its upload's parts: "
                                      "create the batch again once it is.")
        if rec.bytes > self.max_bytes:
            return "image_too_large", (f"The image file {file_id} is {rec.bytes} bytes, over the limit of "
                                       f"{self.max_bytes} bytes per image.")
        return None
