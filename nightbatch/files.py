"""Files use cases: bytes in S3 under keys we make, metadata in the table, expiry enforced on read."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, BinaryIO

from nightbatch.clock import now, sort_key
from nightbatch.errors import InvalidRequestError, NotFoundError
from nightbatch.ids import new_file_id
from nightbatch.limits import QUOTA_ATTR, release_storage, reserve_storage
from nightbatch.settings import Settings
from nightbatch.storage import BlobStore, Table
from nightbatch.wire import DeletedFile, FileObject, ListPage

MIN_EXPIRY_SECONDS = 3600
MAX_EXPIRY_SECONDS = 2_592_000
MAX_FILES_LIMIT = 10_000
MAX_NAME_CHARS = 255


def file_key(file_id: str) -> str:
    return f"files/{file_id}"


def to_wire(item: dict[str, Any]) -> FileObject:
    return FileObject(
        id=item["pk"], bytes=item["bytes"], created_at=item["created_at"], filename=item["filename"],
        purpose=item["purpose"], expires_at=item.get("expires_at"),
        # "uploaded" while an upload's md5 awaits its check, "error" when it failed (nightbatch.assembly).
        status=item.get("status", "processed"), status_details=item.get("status_details"),
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
            return min(self.settings.output_file_ttl_seconds, MAX_EXPIRY_SECONDS)
        return min(self.settings.input_file_ttl_seconds, MAX_EXPIRY_SECONDS)

    def create(
        self, tenant: str, *, filename: str, purpose: str, fileobj: BinaryIO, size: int,
        expires_after_seconds: int | None = None, file_id: str | None = None,
    ) -> FileObject:
        check_expiry_seconds(expires_after_seconds, "expires_after[seconds]")
        check_name(filename, "filename")
        reserve_storage(self.table, tenant, size, settings=self.settings)
        file_id = file_id or new_file_id()
        try:
            self.blobs.put_fileobj(file_key(file_id), fileobj)
            return self.register(
                tenant, file_id=file_id, key=file_key(file_id), size=size, filename=filename, purpose=purpose,
                expires_after_seconds=expires_after_seconds, extra={QUOTA_ATTR: size},
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
        item: dict[str, Any] = {
            "pk": file_id, "kind": "file", "tenant": tenant, "owner": f"{tenant}#file",
            "owner_sk": sort_key(created, file_id), "bytes": size, "created_at": created,
            "filename": filename, "purpose": purpose, "s3_key": key,
        }
        if ttl is not None:
            item["expires_at"] = created + ttl
            item["ttl"] = created + ttl
        item.update(extra or {})
        self.table.put(item)
        return to_wire(item)

    def item(self, tenant: str, file_id: str) -> dict[str, Any]:
        item = self.table.get(file_id) if file_id.startswith("file-") else None
        if (
            item is None or item.get("kind") != "file" or item.get("tenant") != tenant
            or (item.get("expires_at") is not None and item["expires_at"] <= now())
        ):
            raise NotFoundError(f"No such File object: {file_id}", param="id")
        return item

    def get(self, tenant: str, file_id: str) -> FileObject:
        return to_wire(self.item(tenant, file_id))

    def list(
        self, tenant: str, *, purpose: str | None, limit: int, order: str, after: str | None
    ) -> ListPage[FileObject]:
        if not 1 <= limit <= MAX_FILES_LIMIT:
            raise InvalidRequestError(
                f"Invalid 'limit': {limit}. Expected a value between 1 and {MAX_FILES_LIMIT}.",
                param="limit", code="invalid_value",
            )
        if order not in ("asc", "desc"):
            raise InvalidRequestError(
                f"Invalid 'order': '{order}'. Supported values are: 'asc' and 'desc'.",
                param="order", code="invalid_value",
            )
        after_sk = self._cursor(tenant, after, "file") if after else None
        data: list[FileObject] = []
        has_more = False
        t = now()
        for item in self.table.query_owner(
            f"{tenant}#file", ascending=order == "asc", after_sk=after_sk, page_size=min(limit + 1, 1000)
        ):
            if purpose and item["purpose"] != purpose:
                continue
            if item.get("expires_at") is not None and item["expires_at"] <= t:
                continue
            if len(data) == limit:
                has_more = True
                break
            data.append(to_wire(item))
        return page(data, has_more)

    def _cursor(self, tenant: str, after: str, kind: str) -> str:
        item = self.table.get(after)
        if item is None or item.get("kind") != kind or item.get("tenant") != tenant:
            raise InvalidRequestError(f"Invalid 'after': no {kind} with id '{after}'.", param="after")
        return str(item["owner_sk"])

    def delete(self, tenant: str, file_id: str) -> DeletedFile:
        item = self.item(tenant, file_id)
        self.table.delete(file_id)
        self.delete_bytes(item)
        release_storage(self.table, tenant, int(item.get(QUOTA_ATTR, 0)))
        return DeletedFile(id=file_id)

    def delete_bytes(self, item: dict[str, Any]) -> None:
        key = item["s3_key"]
        if key.endswith("/"):
            self.blobs.delete_prefix(key)
        else:
            self.blobs.delete(key)

    def chunks(self, item: dict[str, Any], *, read_ahead: bool = False) -> Iterator[bytes]:
        """The file's bytes, streamed (composed uploads read through their ordered parts)."""
        read = self.blobs.iter_chunks_ahead if read_ahead else self.blobs.iter_chunks
        for key in item.get("parts") or [item["s3_key"]]:
            yield from read(key)


def page(data: list[Any], has_more: bool) -> ListPage[Any]:
    return ListPage(
        data=data, has_more=has_more,
        first_id=data[0].id if data else None, last_id=data[-1].id if data else None,
    )
