"""Files use cases: bytes in S3 under keys we make (each object tagged with its tenant from the moment it is
written: tenancy/scope.py TENANT_TAG_KEY), metadata in the table, expiry enforced on read."""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable, Iterator
from typing import Any, BinaryIO

from nightbatch.aws import BlobStore, Table
from nightbatch.aws.records import BatchRecord, FileRecord
from nightbatch.clock import now
from nightbatch.errors import (
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    PayloadTooLargeError,
    check_range,
    check_supported,
)
from nightbatch.files.inputs import InputReader, InputUnavailable, input_source
from nightbatch.ids import new_file_id
from nightbatch.jsonl import RawLine
from nightbatch.layout import INPUT_TAGS, file_key
from nightbatch.listing import after_sort_key
from nightbatch.settings import Settings
from nightbatch.tenancy.limits import QUOTA_ATTR, batches_in_flight, release_storage, reserve_storage
from nightbatch.tenancy.scope import Scope, tenant_tags
from nightbatch.validation.file_images import FileImages
from nightbatch.wire import TERMINAL_STATUSES, DeletedFile, FileObject, ListPage, list_page

# Purposes a client may upload with (the *_output purposes are ours to write).
UPLOAD_PURPOSES = ("assistants", "batch", "fine-tune", "vision", "user_data", "evals")
MIN_EXPIRY_SECONDS = 3600
MAX_EXPIRY_SECONDS = 2_592_000
MAX_FILES_LIMIT = 10_000
MAX_NAME_CHARS = 255


def to_wire(rec: FileRecord) -> FileObject:
    return FileObject(
        id=rec.pk, bytes=rec.bytes, created_at=rec.created_at, filename=rec.filename, purpose=rec.purpose,
        expires_at=rec.expires_at, status=rec.status or "processed", status_details=rec.status_details,
    )


def check_name(value: str, param: str) -> None:
    """`filename` / `mime_type`: stored in the item and echoed in every listing, so bounded (checked before any
    byte reaches S3, so a refused request leaves nothing behind)."""
    if len(value) > MAX_NAME_CHARS:
        raise InvalidRequestError(
            f"Invalid '{param}': string too long. Expected a string with maximum length {MAX_NAME_CHARS}, "
            f"but got a string with length {len(value)} instead.", param=param, code="string_above_max_length")


def check_expiry_seconds(seconds: int | None, param: str) -> None:
    if seconds is not None and not MIN_EXPIRY_SECONDS <= seconds <= MAX_EXPIRY_SECONDS:
        raise InvalidRequestError(
            f"Invalid '{param}': {seconds}. Expected a number of seconds between "
            f"{MIN_EXPIRY_SECONDS} and {MAX_EXPIRY_SECONDS}.",
            param=param, code="invalid_value",
        )


class FileService:
    def __init__(self, *, settings: Settings, blobs: BlobStore, table: Table) -> None:
        self.settings = settings
        self.blobs = blobs
        self.table = table

    def default_ttl(self, purpose: str) -> int:
        """Every purpose expires, no later than the bucket's 31-day lifecycle removes its bytes (infra/storage.py):
        an item must never outlive its object."""
        if purpose == "batch_output":
            return min(self.settings.files.output_file_ttl_seconds, MAX_EXPIRY_SECONDS)
        return min(self.settings.files.input_file_ttl_seconds, MAX_EXPIRY_SECONDS)

    def upload(
        self, tenant: str, *, filename: str, purpose: str, fileobj: BinaryIO, size: int,
        expires_after_seconds: int | None = None, expires_after_anchor: str | None = None,
    ) -> FileObject:
        """POST /v1/files: a client's file, checked (purpose, anchor, size, expiry) before a byte is stored."""
        check_supported(purpose, UPLOAD_PURPOSES, param="purpose")
        if expires_after_anchor is not None:
            check_supported(expires_after_anchor, ("created_at",), param="expires_after[anchor]")
        limit = self.settings.files.max_upload_bytes
        if size > limit:
            raise PayloadTooLargeError(
                f"File is {size} bytes, over the {limit} byte limit for POST /v1/files on this deployment. "
                "Upload larger files with the Uploads API (POST /v1/uploads; in the OpenAI SDK "
                "client.uploads.upload_file_chunked(..., part_size=4 * 1024 * 1024)).",
                param="file",
            )
        return self.create(tenant, filename=filename, purpose=purpose, fileobj=fileobj, size=size,
                           expires_after_seconds=expires_after_seconds)

    def create(
        self, tenant: str, *, filename: str, purpose: str, fileobj: BinaryIO, size: int,
        expires_after_seconds: int | None = None, file_id: str | None = None,
    ) -> FileObject:
        return self._store(tenant, filename=filename, purpose=purpose, size=size, file_id=file_id,
                           expires_after_seconds=expires_after_seconds,
                           put=lambda key: self.blobs.put_fileobj(key, fileobj, tags=tenant_tags(tenant)))

    def create_lines(self, tenant: str, *, filename: str, lines: Iterable[bytes], size: int) -> FileObject:
        """A batch input written as it is made, line by line (the Anthropic wire's inline requests): `size`,
        their total, is reserved against the tenant's storage first."""
        def put(key: str) -> None:
            writer = self.blobs.writer(key, tags=tenant_tags(tenant))
            try:
                writer.write_lines(lines)
                writer.close()
            except BaseException:
                writer.abort()
                raise
        return self._store(tenant, filename=filename, purpose="batch", size=size, put=put)

    def _store(
        self, tenant: str, *, filename: str, purpose: str, size: int, put: Callable[[str], None],
        expires_after_seconds: int | None = None, file_id: str | None = None,
    ) -> FileObject:
        check_expiry_seconds(expires_after_seconds, "expires_after[seconds]")
        check_name(filename, "filename")
        reserve_storage(self.table, tenant, size, settings=self.settings)
        file_id = file_id or new_file_id()
        try:
            put(file_key(file_id))
            return self.register(
                tenant, file_id=file_id, key=file_key(file_id), size=size, filename=filename, purpose=purpose,
                expires_after_seconds=expires_after_seconds, extra={QUOTA_ATTR: size, "etag": self.etag(file_id)},
            )
        except BaseException:
            self.blobs.delete(file_key(file_id))  # no object without its item
            release_storage(self.table, tenant, size)
            raise

    def register(
        self, tenant: str, *, file_id: str, key: str, size: int, filename: str, purpose: str,
        expires_after_seconds: int | None = None, extra: dict[str, Any] | None = None,
        created_at: int | None = None,
    ) -> FileObject:
        """Records metadata for bytes already in S3 (uploads, batch outputs). Overwrites: callers derive ids."""
        created = created_at if created_at is not None else now()
        ttl = expires_after_seconds if expires_after_seconds is not None else self.default_ttl(purpose)
        rec = FileRecord(
            pk=file_id, tenant=tenant, created_at=created, bytes=size, filename=filename, purpose=purpose,
            s3_key=key, expires_at=created + ttl if ttl is not None else None, **(extra or {}),
        )
        self.table.put_record(rec)
        return to_wire(rec)

    def etag(self, file_id: str) -> str | None:
        """The ETag of the file's object as just written: the version a batch of it accepts
        (nightbatch/files/inputs.py)."""
        head = self.blobs.head(file_key(file_id))
        return None if head is None else str(head["ETag"])

    def item(self, tenant: str, file_id: str) -> FileRecord:
        rec = self.table.get_owned(FileRecord, tenant, file_id)
        if rec is None or not rec.live(now()):
            raise NotFoundError(f"No such File object: {file_id}", param="id")
        return rec

    def images(self, tenant: str, *, tag: bool = False) -> FileImages:
        """The tenant's live files as the images a batch's lines name by file id (validation/file_images.py).
        `tag`: each one accepted is tagged as a batch's input (layout.INPUT_TAGS, what Validate does), which is
        what lets the GPU worker read it (infra/access.py), and nothing else of files/, and with its tenant, which
        the worker checks before it uses it (gpu_worker/images.py; a file stored before objects carried their
        tenant gets it here)."""

        def lookup(file_id: str) -> FileRecord | None:
            rec = self.table.get_owned(FileRecord, tenant, file_id)
            return rec if rec is not None and rec.live(now()) else None

        def accepted(file_id: str) -> None:
            # Gone meanwhile: that line's 400 at run time.
            self.blobs.tag(file_key(file_id), {**INPUT_TAGS, **tenant_tags(tenant)})

        return FileImages(lookup, max_bytes=self.settings.validation.max_image_bytes,
                          accepted=accepted if tag else None, scope=Scope.of(self.settings, tenant))

    def get(self, tenant: str, file_id: str) -> FileObject:
        return to_wire(self.item(tenant, file_id))

    def list(
        self, tenant: str, *, purpose: str | None, limit: int, order: str, after: str | None
    ) -> ListPage[FileObject]:
        check_range(limit, 1, MAX_FILES_LIMIT, param="limit")
        check_supported(order, ("asc", "desc"), param="order", label="order")
        after_sk = after_sort_key(self.table, FileRecord, tenant, after, noun="file")
        t = now()
        recs, has_more = self.table.page(
            FileRecord, FileRecord.owner_of(tenant), limit=limit, ascending=order == "asc",
            after_sk=after_sk,
            keep=lambda r: (not purpose or r.purpose == purpose) and r.live(t),
        )
        return list_page([to_wire(r) for r in recs], has_more)

    def delete(self, tenant: str, file_id: str) -> DeletedFile:
        """The file is gone for the API at once. Its bytes go too, unless an open batch reads them (its shards
        point into them): then they stay until the last such batch ends (`release_held`)."""
        rec = self.item(tenant, file_id)
        # Hidden before the open batches are looked up: a batch created from now on cannot take the file (its
        # create reads a live file) and one created earlier is in flight already, so it is seen.
        held = rec.model_copy(update={"deleted_at": now(), "quota_bytes": 0})
        self.table.put_record(held)
        holders = self.holders(tenant, file_id)
        if holders:
            held.held_by = holders
            self.table.put_record(held)
        else:
            self.table.delete(file_id)
            self.delete_bytes(rec)
        release_storage(self.table, tenant, rec.quota_bytes)
        return DeletedFile(id=file_id)

    def holders(self, tenant: str, file_id: str) -> builtins.list[str]:
        """The tenant's open batches whose input is this file."""
        out = []
        for batch_id in batches_in_flight(self.table, tenant):
            batch = self.table.get_owned(BatchRecord, tenant, batch_id)
            if batch is not None and batch.input_file_id == file_id and batch.status not in TERMINAL_STATUSES:
                out.append(batch_id)
        return out

    def release_held(self) -> builtins.list[str]:
        """Deletes the bytes of deleted files whose batches have all ended (the sweeper). Returns their ids."""
        released = []
        for file_id in self.table.open_ids(FileRecord.HELD_STATUS):
            rec = self.table.get_record(FileRecord, file_id)
            if rec is None or rec.deleted_at is None:
                continue
            if any((b := self.table.get_owned(BatchRecord, rec.tenant, batch_id)) is not None
                   and b.status not in TERMINAL_STATUSES for batch_id in rec.held_by or []):
                continue
            self.delete_bytes(rec)
            self.table.delete(file_id)
            released.append(file_id)
        return released

    def delete_bytes(self, rec: FileRecord) -> None:
        if rec.source_objects:
            return  # read in place from a user's bucket (files/user_buckets.py): not ours to delete
        key = rec.s3_key
        if key.endswith("/"):
            self.blobs.delete_prefix(key)
        else:
            self.blobs.delete(key)

    def reader(self, rec: FileRecord) -> InputReader:
        """The file's bytes at the version accepted (nightbatch/files/inputs.py): an upload not yet composed
        through its ordered parts, a user's objects where they are."""
        return InputReader(self.blobs, input_source(self.blobs, rec))

    def chunks(self, rec: FileRecord, *, read_ahead: bool = False) -> Iterator[bytes]:
        """The file's bytes, streamed; InputUnavailable when they are no longer those accepted."""
        yield from self.reader(rec).stream(0, rec.bytes, read_ahead=read_ahead)

    def lines(self, rec: FileRecord, *, max_bytes: int, read_ahead: bool = False) -> Iterator[RawLine]:
        """A batch input's lines, as Validate numbers them (each object of an in-place input a JSONL file)."""
        yield from self.reader(rec).lines(max_bytes=max_bytes, read_ahead=read_ahead)

    def check_readable(self, rec: FileRecord) -> None:
        """A 409 naming the object (`input_changed` / `input_unreadable`) when the file's bytes are no longer the
        version accepted, asked before a download starts rather than found mid-stream."""
        try:
            self.reader(rec).check()
        except InputUnavailable as e:
            raise ConflictError(f"File {rec.pk} cannot be downloaded: {e.message} Its bytes are not the ones "
                                "accepted any more.", param="file_id", code=e.code) from None
