"""Images by file id (docs/USER_BUCKETS.md): a line's image may name a file the batch's tenant uploaded through the
Files API with purpose "vision" or "user_data". Validate checks each such file here, where its size is known, and
tags its object with the tenant it was checked for (files/service.py); the worker reads its bytes once that tag
names the shard's tenant (gpu_worker/images.py).

Why a cache: an OCR or captioning batch names the same few files (a logo, a few-shot example) on many lines, and
each lookup is a table read; each distinct id is looked up once, within a bound, so memory stays flat however many
distinct files a big batch names (one evicted is looked up again, which costs a read, not a wrong answer).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

from nightbatch.tenancy.scope import Scope
from nightbatch.validation.invalid import LineInvalid

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
    """The images a batch names by file id, and the tenant's scope for those it names by `s3://` URI: what answers
    for a line's references at Validate (validation/media.py). `lookup` answers the batch tenant's live file, or
    None for a missing, expired or deleted one and for another tenant's alike (so its existence never shows).
    `accepted` runs once per file that passed, while its result is cached: Validate tags the object there, for
    the worker to read."""

    def __init__(self, lookup: Callable[[str], ImageFileRecord | None], *, max_bytes: int,
                 accepted: Callable[[str], None] | None = None, cached: int = CACHED_IDS,
                 scope: Scope | None = None) -> None:
        self._lookup, self._accepted, self.max_bytes, self._cached = lookup, accepted, max_bytes, cached
        self.scope = scope  # the batch tenant's: which s3:// images it may name (nightbatch/tenancy/scope.py)
        # id -> the error, or None (fine), and the file's size
        self._known: OrderedDict[str, tuple[tuple[str, str] | None, int]] = OrderedDict()
        self.lookups = 0

    def check(self, file_id: str, param: str) -> int:
        """A LineInvalid naming `param` unless the file is one this batch may use as an image; else its size."""
        if file_id in self._known:
            self._known.move_to_end(file_id)
            error, size = self._known[file_id]
        else:
            self.lookups += 1
            error, size = self._verdict(file_id)
            self._known[file_id] = error, size
            if len(self._known) > self._cached:
                self._known.popitem(last=False)
            if error is None and self._accepted is not None:
                self._accepted(file_id)
        if error is not None:
            raise LineInvalid(error[0], error[1], param)
        return size

    def _verdict(self, file_id: str) -> tuple[tuple[str, str] | None, int]:
        rec = self._lookup(file_id)
        return self._refusal(file_id, rec), rec.bytes if rec is not None else 0

    def _refusal(self, file_id: str, rec: ImageFileRecord | None) -> tuple[str, str] | None:
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
