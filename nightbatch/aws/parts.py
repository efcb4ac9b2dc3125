"""S3 side of the Uploads API: each part its own object, sizes by listing, one object composed from many."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, BinaryIO

from nightbatch.aws.s3 import BlobStore, tagging

# S3 refuses multipart parts under 5 MiB except the last one; parts that small are merged through a buffer.
MIN_PART_BYTES = 5 * 1024 * 1024
# Size of a merged part: bounded memory, and 8 GB stays far below S3's 10,000-part ceiling.
MERGED_PART_BYTES = 8 * 1024 * 1024
HASH_CHUNK_BYTES = 1024 * 1024

Source = tuple[str, int]  # (key, size in bytes)


class PartStore:
    def __init__(self, blobs: BlobStore) -> None:
        self.blobs = blobs
        self.client = blobs.client
        self.bucket = blobs.bucket

    def put(self, key: str, fileobj: BinaryIO, *, md5: bytes, tags: dict[str, str] | None = None) -> None:
        """One PUT (tagged `tags` from the start); Content-MD5 makes S3 refuse a part that arrived damaged."""
        self.client.put_object(
            Bucket=self.bucket, Key=key, Body=fileobj, ContentMD5=base64.b64encode(md5).decode(),
            **({"Tagging": tagging(tags)} if tags else {}),
        )

    def sizes(self, prefix: str) -> dict[str, int]:
        """Every object under `prefix` with its size (S3 listings are strongly consistent)."""
        return {key: size for key, (size, _) in self.listing(prefix).items()}

    def listing(self, prefix: str) -> dict[str, tuple[int, str]]:
        """Every object under `prefix` with its size and ETag."""
        return {str(o["Key"]): (int(o["Size"]), str(o.get("ETag", ""))) for o in self.blobs.list_objects(prefix)}

    def md5(self, keys: Sequence[str]) -> str:
        """The md5 of the objects' bytes concatenated in order, streamed."""
        digest = hashlib.md5(usedforsecurity=False)
        for key in keys:
            for chunk in self.blobs.iter_chunks(key, chunk=HASH_CHUNK_BYTES):
                digest.update(chunk)
        return digest.hexdigest()

    def compose(self, dest: str, sources: Sequence[Source], *, tags: dict[str, str] | None = None,
                etags: Mapping[str, str] | None = None) -> str:
        """Writes the sources' bytes, in order, as the one object `dest` (idempotent: it overwrites), tagged
        `tags` from the start; returns its ETag. `etags`: a source is read only at that ETag (else S3 answers
        412 PreconditionFailed and nothing is written)."""
        if not sources:
            return self.blobs.put_bytes(dest, b"", tags=tags)  # an empty file: Validate refuses it, no shard reads it
        pins = etags or {}
        tagged: dict[str, Any] = {"Tagging": tagging(tags)} if tags else {}
        if len(sources) == 1:
            # Server-side, no bytes through this process (CopyObject takes up to 5 GB; parts are far smaller).
            key = sources[0][0]
            resp = self.client.copy_object(Bucket=self.bucket, Key=dest, CopySource={"Bucket": self.bucket,
                                                                                      "Key": key},
                                           **({"TaggingDirective": "REPLACE", **tagged} if tags else {}),
                                           **_copy_pin(pins, key))
            return str(resp["CopyObjectResult"]["ETag"])
        upload_id = self.client.create_multipart_upload(Bucket=self.bucket, Key=dest, **tagged)["UploadId"]
        try:
            parts = [self._write(dest, upload_id, n, step, pins) for n, step in enumerate(plan(sources), start=1)]
            return str(self.client.complete_multipart_upload(
                Bucket=self.bucket, Key=dest, UploadId=upload_id,
                MultipartUpload={"Parts": [{"ETag": e, "PartNumber": n} for n, e in enumerate(parts, 1)]},
            )["ETag"])
        except BaseException:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=dest, UploadId=upload_id)
            raise

    def _write(self, dest: str, upload_id: str, number: int, step: list[Segment], pins: Mapping[str, str]) -> str:
        common: dict[str, Any] = {
            "Bucket": self.bucket, "Key": dest, "UploadId": upload_id, "PartNumber": number,
        }
        if len(step) == 1 and step[0].copy:
            seg = step[0]
            resp = self.client.upload_part_copy(
                CopySource={"Bucket": self.bucket, "Key": seg.key},
                CopySourceRange=f"bytes={seg.start}-{seg.end - 1}", **common, **_copy_pin(pins, seg.key),
            )
            return str(resp["CopyPartResult"]["ETag"])
        body = b"".join(self._read(seg, pins) for seg in step)
        return str(self.client.upload_part(Body=body, **common)["ETag"])

    def _read(self, seg: Segment, pins: Mapping[str, str]) -> bytes:
        pin = {"IfMatch": pins[seg.key]} if pins.get(seg.key) else {}
        resp = self.client.get_object(
            Bucket=self.bucket, Key=seg.key, Range=f"bytes={seg.start}-{seg.end - 1}", **pin,
        )
        data: bytes = resp["Body"].read()
        return data


def _copy_pin(pins: Mapping[str, str], key: str) -> dict[str, str]:
    return {"CopySourceIfMatch": pins[key]} if pins.get(key) else {}


class Segment:
    """A byte range [start, end) of one source; `copy` = S3 copies it server-side as a whole part."""

    __slots__ = ("copy", "end", "key", "start")

    def __init__(self, key: str, start: int, end: int, *, copy: bool) -> None:
        self.key = key
        self.start = start
        self.end = end
        self.copy = copy

    def __repr__(self) -> str:
        return f"Segment({self.key!r}, {self.start}, {self.end}, copy={self.copy})"


def plan(sources: Sequence[Source]) -> Iterator[list[Segment]]:
    """Output parts in order: a source range of at least 5 MiB is copied server-side as its own part;
    smaller ranges are gathered into merged parts of MERGED_PART_BYTES, topped up from the next source.
    Every part but the last is therefore at least 5 MiB, and memory holds at most one merged part."""
    pending: list[Segment] = []
    pending_bytes = 0
    for key, size in sources:
        offset = 0
        while offset < size:
            remaining = size - offset
            if not pending and remaining >= MIN_PART_BYTES:
                yield [Segment(key, offset, size, copy=True)]
                offset = size
                continue
            take = min(MERGED_PART_BYTES - pending_bytes, remaining)
            pending.append(Segment(key, offset, offset + take, copy=False))
            pending_bytes += take
            offset += take
            if pending_bytes == MERGED_PART_BYTES:
                yield pending
                pending, pending_bytes = [], 0
    if pending:
        yield pending
