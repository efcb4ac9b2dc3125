"""Uploads use cases (docs/ARCHITECTURE.md "The OpenAI wire contract", point 1): each part an S3 object,
/complete in constant time, composed later.

/complete must answer within API Gateway's 30 s whatever the size, so it only checks the listed parts (their
sizes come from one S3 listing), records them in order on a new File item and returns; the File reads through
its parts until the compose step (nightbatch.files.assembly) has written one object.

md5: each part's md5 goes to S3 as Content-MD5 (S3 refuses a damaged part). The whole file's md5 is a
running digest fed as parts arrive in order (nightbatch.files.digests); if the parts overlapped, arrived at
another process or are listed out of arrival order, /complete never re-reads them (that would hold an API
Lambda for up to 8 GB of reads): the compose step checks the md5, and until then the File is `uploaded`,
not yet a batch input (a mismatch then marks it `error`, unusable).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, BinaryIO

from pydantic import BaseModel

from nightbatch.aws import Table
from nightbatch.aws.parts import PartStore
from nightbatch.aws.records import FileRecord, UploadRecord
from nightbatch.clock import now
from nightbatch.errors import (
    ConflictError,
    InvalidRequestError,
    PayloadTooLargeError,
    StorageConflictError,
    check_supported,
)
from nightbatch.files.assembly import UploadJobs
from nightbatch.files.digests import RunningDigests
from nightbatch.files.service import UPLOAD_PURPOSES, FileService, check_expiry_seconds, check_name
from nightbatch.files.service import to_wire as file_to_wire
from nightbatch.ids import new_file_id, new_part_id, new_upload_id
from nightbatch.layout import file_key, part_key, parts_prefix, upload_prefix
from nightbatch.settings import Settings
from nightbatch.tenancy.limits import release_storage, reserve_storage
from nightbatch.tenancy.scope import tenant_tags
from nightbatch.wire import FileObject, Upload, UploadPart

log = logging.getLogger("nightbatch.files.uploads")

PART_ID_RE = re.compile(r"^part_[0-9a-f]{24}$")
HASH_CHUNK_BYTES = 1024 * 1024
# Expired and cancelled uploads stay answerable for a day, then the table's TTL removes them.
UPLOAD_ITEM_LINGER_SECONDS = 86_400
OPEN_STATUS = UploadRecord.OPEN_STATUS


class ExpiresAfter(BaseModel):
    anchor: str = "created_at"
    seconds: int


class CreateUploadRequest(BaseModel):
    bytes: int
    filename: str
    mime_type: str
    purpose: str
    expires_after: ExpiresAfter | None = None


class CompleteUploadRequest(BaseModel):
    part_ids: list[str]
    md5: str | None = None


def human_bytes(n: int) -> str:
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} bytes"


def part_limit_message(limit: int) -> str:
    return (
        f"Upload part is larger than the {human_bytes(limit)} part limit on this deployment. Send smaller "
        f"parts: client.uploads.upload_file_chunked(..., part_size={limit})."
    )


def effective_status(rec: UploadRecord) -> str:
    if rec.status == "pending" and now() >= rec.expires_at:
        return "expired"
    return rec.status


def normalize_md5(value: str) -> str:
    """Hex (what the SDK docs show) or base64 (Content-MD5 style) → lower-case hex."""
    v = value.strip()
    if re.fullmatch(r"[0-9a-fA-F]{32}", v):
        return v.lower()
    try:
        raw = base64.b64decode(v, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) == 16:
        return raw.hex()
    raise InvalidRequestError(
        f"Invalid 'md5': '{value[:64]}'. Expected the md5 of the file as 32 hexadecimal characters.",
        param="md5", code="invalid_value",
    )


@dataclass(kw_only=True)
class UploadService:
    settings: Settings
    table: Table
    files: FileService
    parts: PartStore
    jobs: UploadJobs
    digests: RunningDigests = field(default_factory=RunningDigests)

    # -- create ---------------------------------------------------------------------------------------------

    def create(self, tenant: str, req: CreateUploadRequest) -> Upload:
        check_supported(req.purpose, UPLOAD_PURPOSES, param="purpose")
        limit = self.settings.uploads.max_total_bytes
        if not 0 <= req.bytes <= limit:
            raise InvalidRequestError(
                f"Invalid 'bytes': {req.bytes}. An Upload holds between 0 and {limit} bytes "
                f"({human_bytes(limit)}).", param="bytes", code="invalid_value",
            )
        if not req.filename.strip():
            raise InvalidRequestError("Invalid 'filename': it must not be empty.", param="filename",
                                      code="invalid_value")
        if not req.mime_type.strip():
            raise InvalidRequestError("Invalid 'mime_type': it must not be empty.", param="mime_type",
                                      code="invalid_value")
        check_name(req.filename, "filename")
        check_name(req.mime_type, "mime_type")
        file_ttl = None
        if req.expires_after is not None:
            check_supported(req.expires_after.anchor, ("created_at",), param="expires_after.anchor")
            check_expiry_seconds(req.expires_after.seconds, "expires_after.seconds")
            file_ttl = req.expires_after.seconds
        upload_id = new_upload_id()
        created = now()
        # OpenAI: an Upload expires an hour after creation (`hour_seconds` shortens it in tests).
        expires = created + max(1, round(self.settings.validation.hour_seconds))
        rec = UploadRecord(
            pk=upload_id, tenant=tenant, bytes=req.bytes, filename=req.filename, mime_type=req.mime_type,
            purpose=req.purpose, status="pending", created_at=created, expires_at=expires,
            ttl=expires + UPLOAD_ITEM_LINGER_SECONDS, file_expires_after_seconds=file_ttl, quota_bytes=req.bytes,
        )
        # The declared size counts against the tenant's stored bytes until the Upload ends.
        reserve_storage(self.table, tenant, req.bytes, settings=self.settings)
        try:
            self.table.put_record(rec, new=True)
        except BaseException:
            release_storage(self.table, tenant, req.bytes)
            raise
        self.digests.start(upload_id)
        return self.to_wire(rec)

    # -- parts ----------------------------------------------------------------------------------------------

    def add_part(self, tenant: str, upload_id: str, fileobj: BinaryIO, size: int) -> UploadPart:
        limit = self.settings.uploads.max_part_bytes
        if size > limit:
            raise PayloadTooLargeError(part_limit_message(limit), param="data")
        item = self.require_pending(self.item(tenant, upload_id), "no more parts can be added")
        self._reserve_part(tenant, item, size)
        try:
            return self._store_part(tenant, upload_id, fileobj, size)
        except BaseException:
            # Give the room back: the part never landed.
            self.table.update_attributes(UploadRecord, upload_id, add={"parts_received": -1, "bytes_received": -size})
            raise

    def _reserve_part(self, tenant: str, item: UploadRecord, size: int) -> None:
        """Counts the part before any byte reaches S3, in one conditional UpdateItem: still pending, fewer than
        `max_upload_parts` parts, and no more bytes than the Upload declared (concurrent parts cannot race past
        either check)."""
        upload_id = item.pk
        max_parts = self.settings.uploads.max_parts
        try:
            self.table.update_attributes(UploadRecord, upload_id, add={"parts_received": 1, "bytes_received": size},
                                         expect_in={"status": ("pending",)},
                                         expect_at_most={"parts_received": max_parts - 1,
                                                         "bytes_received": item.bytes - size})
            return
        except StorageConflictError:
            fresh = self.require_pending(self.item(tenant, upload_id), "no more parts can be added")
        if fresh.parts_received >= max_parts:
            raise InvalidRequestError(
                f"Upload {upload_id} already has {max_parts} parts, the most one Upload "
                "can hold on this deployment. Use larger parts.", param="data", code="too_many_parts",
            )
        raise InvalidRequestError(
            f"Upload {upload_id} was created with bytes={item.bytes} and has received "
            f"{fresh.bytes_received}; a part of {size} bytes does not fit.",
            param="data", code="upload_size_exceeded")

    def _store_part(self, tenant: str, upload_id: str, fileobj: BinaryIO, size: int) -> UploadPart:
        part_id = new_part_id()
        key = part_key(upload_id, part_id)
        running, base = self.digests.fork(upload_id)
        part_md5 = hashlib.md5(usedforsecurity=False)
        fileobj.seek(0)
        while chunk := fileobj.read(HASH_CHUNK_BYTES):
            part_md5.update(chunk)
            if running is not None:
                running.update(chunk)
        fileobj.seek(0)
        self.parts.put(key, fileobj, md5=part_md5.digest(), tags=tenant_tags(tenant))
        created = now()
        fresh = self.table.get_record(UploadRecord, upload_id)
        if fresh is None or fresh.status != "pending":
            # Cancelled or completed while the bytes were on their way: this part must not linger.
            self.parts.blobs.delete(key)
            raise ConflictError("The Upload changed while the part arrived; it was not added.",
                                param="upload_id", code=f"upload_{fresh.status if fresh else 'cancelled'}")
        if running is not None:
            self.digests.advance(upload_id, base, running, part_id)
        return UploadPart(id=part_id, created_at=created, upload_id=upload_id)

    # -- complete -------------------------------------------------------------------------------------------

    def complete(self, tenant: str, upload_id: str, req: CompleteUploadRequest) -> Upload:
        item = self.item(tenant, upload_id)
        if item.status == "completed" and item.part_ids == req.part_ids:
            return self._completed_again(item)
        self.require_pending(item, "it cannot be completed")
        keys, etags, total = self._listed_parts(upload_id, req.part_ids)
        if total != item.bytes:
            raise InvalidRequestError(
                f"The parts listed in 'part_ids' add up to {total} bytes, but the Upload was created with "
                f"bytes={item.bytes}. List every part, in order, exactly once.",
                param="part_ids", code="upload_size_mismatch",
            )
        extra: dict[str, Any] = {"upload_id": upload_id}
        if req.md5 is not None and not self._check_md5(upload_id, req.part_ids, req.md5):
            # No running digest: the compose step checks it (see nightbatch.files.assembly), never this request.
            extra.update(status="uploaded", md5_expected=normalize_md5(req.md5))
        file_id = new_file_id()
        if keys:
            extra.update(parts=keys, part_etags=etags)  # the version accepted (nightbatch/files/inputs.py)
        else:
            extra["etag"] = self.parts.blobs.put_bytes(file_key(file_id), b"", tags=tenant_tags(tenant))
        file = self.files.register(
            tenant, file_id=file_id, key=file_key(file_id), size=total, filename=item.filename,
            purpose=item.purpose, expires_after_seconds=item.file_expires_after_seconds,
            extra={**extra, "quota_bytes": item.quota_bytes},  # the Upload's share passes to its File
        )
        try:
            item = self.table.update_record(UploadRecord, upload_id, set_={
                "status": "completed", "completed_at": now(), "file_id": file_id, "part_ids": req.part_ids,
            }, remove=("open_status",), expect_in={"status": ("pending",)})
        except StorageConflictError:
            # Lost to a concurrent complete or cancel: this attempt's File must not survive.
            self.table.delete(file_id)
            if not keys:
                self.parts.blobs.delete(file_key(file_id))
            fresh = self.item(tenant, upload_id)
            if fresh.status == "completed" and fresh.part_ids == req.part_ids:
                return self._completed_again(fresh)
            self.require_pending(fresh, "it cannot be completed")
            raise ConflictError("The Upload changed while it was being completed; try again.",
                                retry=True) from None
        self.digests.forget(upload_id)
        if keys:
            # A failure here is a 500: the SDK retries, and the retried complete dispatches again.
            self.jobs.compose(file_id, upload_id, delay_seconds=self.settings.uploads.compose_delay_seconds)
        return self.to_wire(item, file=file)

    def _completed_again(self, item: UploadRecord) -> Upload:
        """A retried complete (the SDK retries POSTs): same answer, and composition is requested again."""
        file_rec = self.table.get_record(FileRecord, item.file_id)
        if file_rec is not None and file_rec.parts:
            self.jobs.compose(file_rec.pk, item.pk)
        return self.to_wire(item)

    def _listed_parts(self, upload_id: str, part_ids: list[str]) -> tuple[list[str], list[str], int]:
        if len(part_ids) > self.settings.uploads.max_parts:
            raise InvalidRequestError(
                f"Invalid 'part_ids': {len(part_ids)} parts; an Upload holds at most "
                f"{self.settings.uploads.max_parts} on this deployment.",
                param="part_ids", code="invalid_value",
            )
        if len(set(part_ids)) != len(part_ids):
            dup = next(p for p in part_ids if part_ids.count(p) > 1)
            raise InvalidRequestError(f"Invalid 'part_ids': part '{dup}' is listed more than once.",
                                      param="part_ids", code="invalid_value")
        listed = self.parts.listing(parts_prefix(upload_id))
        keys: list[str] = []
        etags: list[str] = []
        total = 0
        for pid in part_ids:
            key = part_key(upload_id, pid) if PART_ID_RE.fullmatch(pid) else ""
            if key not in listed:
                raise InvalidRequestError(f"Invalid 'part_ids': Upload {upload_id} has no part '{pid[:64]}'.",
                                          param="part_ids", code="invalid_value")
            keys.append(key)
            etags.append(listed[key][1])
            total += listed[key][0]
        return keys, etags, total

    def _check_md5(self, upload_id: str, part_ids: list[str], md5: str) -> bool:
        """True when checked now from the running digest (400 on mismatch); False when the compose step must."""
        expected = normalize_md5(md5)
        actual = self.digests.hexdigest(upload_id, part_ids)
        if actual is None:
            return False
        if actual != expected:
            raise InvalidRequestError(
                f"The md5 checksum you provided ({expected}) does not match the md5 of the uploaded parts in "
                f"the order given ({actual}).", param="md5", code="md5_mismatch",
            )
        return True

    # -- cancel ---------------------------------------------------------------------------------------------

    def cancel(self, tenant: str, upload_id: str) -> Upload:
        item = self.item(tenant, upload_id)
        status = effective_status(item)
        if status == "expired":
            return self.to_wire(self._expire(item))
        if status == "completed":
            raise ConflictError(f"Cannot cancel Upload {upload_id}: it is already completed.",
                                param="upload_id", code="upload_completed")
        if status == "pending":
            try:
                item = self.table.update_record(UploadRecord, upload_id, remove=("open_status",),
                                                set_={"status": "cancelled", "cancelled_at": now()},
                                                expect_in={"status": ("pending",)})
            except StorageConflictError:
                return self.cancel(tenant, upload_id)  # completed or cancelled meanwhile: answer for that
            release_storage(self.table, tenant, item.quota_bytes)
            self.parts.blobs.delete_prefix(upload_prefix(upload_id))
            self.digests.forget(upload_id)
        return self.to_wire(item)

    # -- shared ---------------------------------------------------------------------------------------------

    def item(self, tenant: str, upload_id: str) -> UploadRecord:
        return self.table.require_owned(UploadRecord, tenant, upload_id, param="upload_id",
                                        missing=f"No such Upload object: {upload_id}")

    def require_pending(self, item: UploadRecord, consequence: str) -> UploadRecord:
        status = effective_status(item)
        if status == "pending":
            return item
        upload_id = item.pk
        if status == "expired":
            self._expire(item)
            when = datetime.fromtimestamp(item.expires_at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
            message = (f"Upload {upload_id} expired at {when} (an Upload expires 1 hour after it is "
                       f"created); {consequence}. Create a new Upload.")
        elif status == "completed":
            message = f"Upload {upload_id} is already completed; {consequence}."
        else:
            message = f"Upload {upload_id} was cancelled; {consequence}."
        raise ConflictError(message, param="upload_id", code=f"upload_{status}")

    def _expire(self, item: UploadRecord) -> UploadRecord:
        """Records `expired` (so a late complete cannot slip in) and drops the parts."""
        try:
            item = self.table.update_record(UploadRecord, item.pk, set_={"status": "expired"},
                                            remove=("open_status",), expect_in={"status": ("pending",)})
        except StorageConflictError:
            return self.table.get_record(UploadRecord, item.pk) or item
        release_storage(self.table, item.tenant, item.quota_bytes)
        self.parts.blobs.delete_prefix(upload_prefix(item.pk))
        self.digests.forget(item.pk)
        return item

    def sweep_expired(self) -> list[str]:
        """Expires pending Uploads past their hour (the sweeper): parts deleted, stored bytes given back."""
        expired: list[str] = []
        for upload_id in self.table.open_ids(OPEN_STATUS):
            item = self.table.get_record(UploadRecord, upload_id)
            if item is not None and effective_status(item) == "expired" and item.status == "pending":
                self._expire(item)
                expired.append(item.pk)
        return expired

    def to_wire(self, item: UploadRecord, *, file: FileObject | None = None) -> Upload:
        status = effective_status(item)
        if status == "completed" and file is None and item.file_id:
            file_rec = self.table.get_record(FileRecord, item.file_id)
            # A deleted file whose bytes a batch still reads (FileRecord.deleted_at) is gone here too.
            file = file_to_wire(file_rec) if file_rec is not None and file_rec.deleted_at is None else None
        return Upload(
            id=item.pk, bytes=item.bytes, created_at=item.created_at, expires_at=item.expires_at,
            filename=item.filename, purpose=item.purpose, status=status,
            file=file if status == "completed" else None,
        )

