"""S3 adapter: streamed puts and gets, line iteration, a multipart line writer, pre-signed links."""

from __future__ import annotations

import io
import queue
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, BinaryIO
from urllib.parse import urlencode

from nightbatch.aws.botoerrors import client_error

if TYPE_CHECKING:
    from botocore.exceptions import ClientError

# S3 rejects multipart parts under 5 MiB (except the last); 8 MiB keeps memory flat and part counts low.
PART_BYTES = 8 * 1024 * 1024
CHUNK_BYTES = 256 * 1024


class Version:
    """Which version of an object a read must get: its ETag, sent as If-Match, and in a versioned bucket its
    VersionId, read by (an overwrite or a delete marker then leaves it readable). An empty field is filled from
    the first answer that carries it, so a read that starts unpinned is pinned from then on."""

    __slots__ = ("etag", "version_id")

    def __init__(self, etag: str = "", version_id: str = "") -> None:
        self.etag, self.version_id = etag, version_id

    def params(self) -> dict[str, str]:
        out = {"IfMatch": self.etag} if self.etag else {}
        if self.version_id:
            out["VersionId"] = self.version_id
        return out

    def learn(self, answer: dict[str, Any]) -> None:
        if not self.etag and answer.get("ETag"):
            self.etag = str(answer["ETag"])
        # "null": the version of a bucket whose versioning is suspended, which the next PUT replaces: not a pin.
        if not self.version_id and answer.get("VersionId") not in (None, "", "null"):
            self.version_id = str(answer["VersionId"])


class BlobStore:
    def __init__(self, *, client: Any, bucket: str) -> None:
        self.client = client
        self.bucket = bucket

    def in_bucket(self, bucket: str) -> BlobStore:
        """The same client over another bucket ("" or this one: self): a user's allow-listed bucket
        (nightbatch/files/user_buckets.py)."""
        return self if not bucket or bucket == self.bucket else BlobStore(client=self.client, bucket=bucket)

    def copy_to(self, key: str, bucket: str, dest_key: str) -> None:
        """A server-side copy of this bucket's `key` to `bucket`/`dest_key` (multipart past 5 GB)."""
        self.client.copy({"Bucket": self.bucket, "Key": key}, bucket, dest_key)

    def put_bytes(self, key: str, data: bytes, *, content_type: str = "application/octet-stream",
                  tags: dict[str, str] | None = None) -> str:
        """One PUT (tagged `tags` from the start); returns the object's ETag (as a listing shows it)."""
        tagged = {"Tagging": tagging(tags)} if tags else {}
        return str(self.client.put_object(Bucket=self.bucket, Key=key, Body=data, ContentType=content_type,
                                          **tagged)["ETag"])

    def append(self, key: str, size: int, data: bytes, *, content_type: str = "application/octet-stream") -> str:
        """Replaces object `key` of `size` bytes (at least S3's 5 MiB part minimum) by itself followed by `data`,
        in one multipart upload: its bytes copied server-side as the first part, `data` sent as the last. Atomic
        as a PUT: a reader sees the old object or the new one; an upload that never completes (the process killed
        between its parts) leaves the old one, and is aborted (here, or by the bucket's lifecycle rule). Returns
        the new ETag (as a listing shows it)."""
        upload_id = self.client.create_multipart_upload(Bucket=self.bucket, Key=key,
                                                        ContentType=content_type)["UploadId"]
        common = {"Bucket": self.bucket, "Key": key, "UploadId": upload_id}
        try:
            first = self.client.upload_part_copy(CopySource={"Bucket": self.bucket, "Key": key}, PartNumber=1,
                                                 CopySourceRange=f"bytes=0-{size - 1}", **common)[
                "CopyPartResult"]["ETag"]
            last = self.client.upload_part(Body=data, PartNumber=2, **common)["ETag"]
            return str(self.client.complete_multipart_upload(MultipartUpload={"Parts": [
                {"ETag": first, "PartNumber": 1}, {"ETag": last, "PartNumber": 2}]}, **common)["ETag"])
        except BaseException:
            self.client.abort_multipart_upload(**common)
            raise

    def put_fileobj(self, key: str, fileobj: BinaryIO, *, tags: dict[str, str] | None = None) -> None:
        self.client.upload_fileobj(fileobj, self.bucket, key, ExtraArgs={"Tagging": tagging(tags)} if tags else None)

    def get_bytes(self, key: str) -> bytes | None:
        try:
            body: bytes = self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except client_error() as e:
            if _missing(e):
                return None
            raise
        return body

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """The bytes [start, end) of an object that exists."""
        return b"".join(self.iter_chunks(key, start=start, end=end))

    def iter_chunks(self, key: str, *, start: int = 0, end: int | None = None, chunk: int = CHUNK_BYTES,
                    version: Version | None = None) -> Iterator[bytes]:
        """The bytes [start, end) of `key` (to its end when `end` is None), streamed in one GET; of `version` when
        given (S3 answers 412 PreconditionFailed, or 404 NoSuchVersion, when it is no longer there)."""
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": key}
        if end is not None:
            if end <= start:
                return
            kwargs["Range"] = f"bytes={start}-{end - 1}"
        elif start:
            kwargs["Range"] = f"bytes={start}-"
        if version is not None:
            kwargs.update(version.params())
        resp = self.client.get_object(**kwargs)
        if version is not None:
            version.learn(resp)
        body = resp["Body"]
        try:
            yield from body.iter_chunks(chunk)
        finally:
            body.close()

    def iter_chunks_ahead(self, key: str, *, chunk: int = 1024 * 1024, depth: int = 8, start: int = 0,
                          end: int | None = None, version: Version | None = None) -> Iterator[bytes]:
        """iter_chunks with a reader thread a few chunks ahead, so network waits overlap the caller's parsing."""
        q: queue.Queue[bytes | BaseException | None] = queue.Queue(maxsize=depth)
        stop = threading.Event()

        def read() -> None:
            try:
                for c in self.iter_chunks(key, chunk=chunk, start=start, end=end, version=version):
                    while not stop.is_set():
                        try:
                            q.put(c, timeout=0.5)
                            break
                        except queue.Full:
                            continue
                    if stop.is_set():
                        return
                q.put(None)
            except BaseException as e:  # handed to the consumer, which re-raises it
                q.put(e)

        t = threading.Thread(target=read, name="s3-read-ahead", daemon=True)
        t.start()
        try:
            while True:
                item = q.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()

    def size(self, key: str) -> int | None:
        head = self.head(key)
        return None if head is None else int(head["ContentLength"])

    def head(self, key: str, version: Version | None = None) -> dict[str, Any] | None:
        """HeadObject's answer (ContentLength, ETag, VersionId in a versioned bucket, Metadata), of `version` when
        given; None when the object does not exist (a changed version raises, as iter_chunks does)."""
        try:
            head: dict[str, Any] = self.client.head_object(Bucket=self.bucket, Key=key,
                                                           **(version.params() if version is not None else {}))
        except client_error() as e:
            if _missing(e) and version is None:
                return None
            raise
        if version is not None:
            version.learn(head)
        return head

    def written_at(self, key: str) -> float | None:
        """When the object was last written (epoch seconds): what S3's lifecycle counts its age from."""
        try:
            return float(self.client.head_object(Bucket=self.bucket, Key=key)["LastModified"].timestamp())
        except client_error() as e:
            if _missing(e):
                return None
            raise

    def rewrite(self, key: str, metadata: dict[str, str], *, tags: dict[str, str] | None = None,
                etag: str = "") -> None:
        """Copies the object onto itself, server-side (multipart past 5 GB): same bytes, written now. `tags` are
        added to its tags in the same call (a multipart copy would otherwise drop them all); `etag`: only if the
        object is still that one (else 412 PreconditionFailed)."""
        extra: dict[str, Any] = {"MetadataDirective": "REPLACE", "Metadata": metadata}
        if tags is not None:
            extra.update(TaggingDirective="REPLACE", Tagging=tagging({**self.tags(key), **tags}))
        if etag:
            extra["CopySourceIfMatch"] = etag
        self.client.copy({"Bucket": self.bucket, "Key": key}, self.bucket, key, ExtraArgs=extra)

    def tag(self, key: str, tags: dict[str, str]) -> bool:
        """Adds `tags` to the object's tags, keeping the others (S3 sets a whole tag set at once: the object's
        tenant stays when Validate marks it a batch's input); False when it does not exist."""
        current = self.tags(key)
        merged = {**current, **tags}
        if merged == current:
            return bool(current)  # nothing to add (none at all: no object, or one with no tags to keep)
        try:
            self.client.put_object_tagging(Bucket=self.bucket, Key=key, Tagging={
                "TagSet": [{"Key": k, "Value": v} for k, v in merged.items()]})
        except client_error() as e:
            if _missing(e):
                return False
            raise
        return True

    def tags(self, key: str) -> dict[str, str]:
        """The object's tags; none when it does not exist."""
        try:
            tag_set = self.client.get_object_tagging(Bucket=self.bucket, Key=key)["TagSet"]
        except client_error() as e:
            if _missing(e):
                return {}
            raise
        return {str(t["Key"]): str(t["Value"]) for t in tag_set}

    def exists(self, key: str) -> bool:
        return self.size(key) is not None

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=key)

    def list_keys(self, prefix: str) -> Iterator[str]:
        for obj in self.list_objects(prefix):
            yield str(obj["Key"])

    def list_objects(self, prefix: str, *, page: int = 1000) -> Iterator[dict[str, Any]]:
        """Every object under `prefix` as ListObjectsV2 describes it, in key order, `page` a request. Pages are
        followed here rather than by a boto3 paginator, whose model a process loads on its first use (~10 ms)."""
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix, "MaxKeys": page}
        while True:
            resp = self.client.list_objects_v2(**kwargs)
            yield from resp.get("Contents", [])
            if not resp.get("IsTruncated") or not resp.get("NextContinuationToken"):
                return
            kwargs["ContinuationToken"] = resp["NextContinuationToken"]

    def delete_prefix(self, prefix: str) -> None:
        batch: list[dict[str, str]] = []
        for key in self.list_keys(prefix):
            batch.append({"Key": key})
            if len(batch) == 1000:
                self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch})
                batch = []
        if batch:
            self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch})

    def presign_get(self, key: str, *, expires: int = 300, filename: str | None = None) -> str:
        params: dict[str, Any] = {"Bucket": self.bucket, "Key": key}
        if filename:
            params["ResponseContentDisposition"] = f'attachment; filename="{_ascii(filename)}"'
        url: str = self.client.generate_presigned_url("get_object", Params=params, ExpiresIn=expires)
        return url

    def writer(self, key: str, *, tags: dict[str, str] | None = None) -> LineWriter:
        return LineWriter(self, key, tags=tags)


class LineWriter:
    """Streams bytes into one S3 object: one PUT when small, a multipart upload past PART_BYTES."""

    def __init__(self, store: BlobStore, key: str, *, tags: dict[str, str] | None = None) -> None:
        self.store = store
        self.key = key
        self.tags = tags  # the object's, from the start
        self.buf = io.BytesIO()
        self.upload_id: str | None = None
        self.parts: list[dict[str, Any]] = []
        self.bytes_written = 0
        # One part uploads in the background while the next fills: bounded memory, overlapped I/O.
        self.pool: ThreadPoolExecutor | None = None
        self.pending: Future[dict[str, Any]] | None = None

    def write(self, data: bytes) -> None:
        self.buf.write(data)
        self.bytes_written += len(data)
        if self.buf.tell() >= PART_BYTES:
            self._flush_part()

    def write_lines(self, lines: Iterable[bytes]) -> None:
        for line in lines:
            self.write(line)

    def _flush_part(self) -> None:
        c = self.store.client
        if self.upload_id is None:
            tagged = {"Tagging": tagging(self.tags)} if self.tags else {}
            self.upload_id = c.create_multipart_upload(Bucket=self.store.bucket, Key=self.key, **tagged)["UploadId"]
            self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="s3-part")
        self._wait_pending()
        n = len(self.parts) + len([self.pending] if self.pending else []) + 1
        body = self.buf.getvalue()
        upload_id = self.upload_id

        def upload() -> dict[str, Any]:
            resp = c.upload_part(Bucket=self.store.bucket, Key=self.key, UploadId=upload_id, PartNumber=n, Body=body)
            return {"ETag": resp["ETag"], "PartNumber": n}

        assert self.pool is not None
        self.pending = self.pool.submit(upload)
        self.buf = io.BytesIO()

    def _wait_pending(self) -> None:
        if self.pending is not None:
            self.parts.append(self.pending.result())
            self.pending = None

    def close(self, *, keep_empty: bool = True) -> int:
        """Completes the object; returns its size. `keep_empty=False`: nothing written leaves no object (no PUT)."""
        if self.upload_id is None:
            if self.bytes_written or keep_empty:
                self.store.put_bytes(self.key, self.buf.getvalue(), tags=self.tags)
        else:
            if self.buf.tell():
                self._flush_part()
            self._wait_pending()
            self._shutdown()
            self.store.client.complete_multipart_upload(
                Bucket=self.store.bucket, Key=self.key, UploadId=self.upload_id,
                MultipartUpload={"Parts": self.parts},
            )
        self.buf = io.BytesIO()
        return self.bytes_written

    def _shutdown(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)
            self.pool = None

    def abort(self) -> None:
        if self.pending is not None:
            self.pending.cancel()
            self.pending = None
        self._shutdown()
        if self.upload_id is not None:
            self.store.client.abort_multipart_upload(
                Bucket=self.store.bucket, Key=self.key, UploadId=self.upload_id
            )
            self.upload_id = None

    def __enter__(self) -> LineWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def tagging(tags: dict[str, str]) -> str:
    """Tags as the `Tagging` parameter of PutObject, CopyObject and CreateMultipartUpload (URL-encoded)."""
    return urlencode(tags)


def _missing(e: ClientError) -> bool:
    code = str(e.response.get("Error", {}).get("Code", ""))
    return code in {"404", "NoSuchKey", "NotFound"}


def _ascii(name: str) -> str:
    return "".join(ch if 32 <= ord(ch) < 127 and ch not in '"\\' else "_" for ch in name)
