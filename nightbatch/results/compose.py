"""The output file assembled server-side: ranges of checkpoint objects copied by S3 (UploadPartCopy) where
they are big enough to be parts of their own, the rest gathered into uploaded parts.

Every part but the last is at least 5 MiB (S3's floor). A range of at least 5 MiB is copied without its
bytes passing through this process; a smaller one joins the merged part being gathered, which is sent once it
holds MERGED_PART_BYTES, and the last one at the end. So the bytes uploaded are exactly those of the small
ranges (workers write checkpoints of 5 MiB, nightbatch.settings `checkpoint_bytes`, and append an attempt's
last lines to its previous checkpoint: usually just each attempt's first), never a top-up read from a big
range. The output's lines are therefore not in the checkpoints' order: a merged part's lines come where that
part is sent (nightbatch.results.input_order orders them, when asked). OpenAI promises no line order
(clients match by custom_id); which result of a custom_id counts is decided before, by the merge order
(nightbatch.results.precedence). A merged part is sent whole, at a line boundary, since copied parts come between
merged ones. The part layout depends only on the sequence of ranges, so a re-run writes the same object.

Parts are sent by a few threads while the caller reads on: Finalize reads the next checkpoint while S3
copies the last one (part numbers are given in order when a part is queued, so the object is the same).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from nightbatch.aws import BlobStore
from nightbatch.aws.parts import MERGED_PART_BYTES, MIN_PART_BYTES

__all__ = ["MERGED_PART_BYTES", "MIN_PART_BYTES", "PartComposer", "Read"]

Read = Callable[[int, int], bytes | memoryview]

IN_FLIGHT = 3  # parts being sent at once: at most this many merged parts (8 MiB and up) held beyond the buffer


class PartComposer:
    def __init__(self, blobs: BlobStore, key: str) -> None:
        self.client = blobs.client
        self.blobs = blobs
        self.bucket = blobs.bucket
        self.key = key
        self.buf = bytearray()
        self.upload_id: str | None = None
        self.parts: list[Future[str]] = []  # ETag of part n + 1, in part order
        self.settled = 0  # parts[:settled] are sent (and succeeded)
        self.pool: ThreadPoolExecutor | None = None
        self.size = 0
        self.copied = 0  # bytes S3 copied server-side

    def add_bytes(self, data: bytes | memoryview) -> None:
        """Whole lines (or a range of them) for the merged part; it is sent once it holds MERGED_PART_BYTES."""
        self.buf += data
        self.size += len(data)
        if len(self.buf) >= MERGED_PART_BYTES:
            self._upload(bytes(self.buf))
            self.buf.clear()

    def add_range(self, source: str, start: int, end: int, read: Read) -> None:
        """Bytes [start, end) of object `source`, whole lines. `read(a, b)` gives its bytes [a, b); it is asked
        only for a range too small to copy, whose bytes join the merged part."""
        if start >= end:
            return
        if end - start < MIN_PART_BYTES:
            self.add_bytes(read(start, end))
            return
        copy_range = f"bytes={start}-{end - 1}"
        self._send(lambda common: str(self.client.upload_part_copy(
            CopySource={"Bucket": self.bucket, "Key": source}, CopySourceRange=copy_range,
            **common)["CopyPartResult"]["ETag"]))
        self.size += end - start
        self.copied += end - start

    def close(self) -> int:
        """Completes the object and returns its size (0: nothing was written, no object is left)."""
        if self.upload_id is None:
            if self.size:
                self.blobs.put_bytes(self.key, bytes(self.buf))
            return self.size
        if self.buf:
            self._upload(bytes(self.buf))
            self.buf.clear()
        etags = [f.result() for f in self.parts]
        self._shutdown()
        self.client.complete_multipart_upload(
            Bucket=self.bucket, Key=self.key, UploadId=self.upload_id,
            MultipartUpload={"Parts": [{"ETag": e, "PartNumber": n} for n, e in enumerate(etags, 1)]})
        return self.size

    def abort(self) -> None:
        for f in self.parts:
            f.exception()  # wait for every part in flight; the upload is dropped whatever they did
        self._shutdown()
        if self.upload_id is not None:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=self.key, UploadId=self.upload_id)

    def _upload(self, body: bytes) -> None:
        self._send(lambda common: str(self.client.upload_part(Body=body, **common)["ETag"]))

    def _send(self, call: Callable[[dict[str, Any]], str]) -> None:
        """Queues the next part; waits first while IN_FLIGHT parts are still being sent (bounded memory)."""
        if self.upload_id is None:
            self.upload_id = str(self.client.create_multipart_upload(Bucket=self.bucket, Key=self.key)["UploadId"])
            self.pool = ThreadPoolExecutor(IN_FLIGHT, thread_name_prefix="compose")
        assert self.pool is not None
        busy = [f for f in self.parts[self.settled:] if not f.done()]
        if len(busy) >= IN_FLIGHT:
            busy[0].result()
        while self.settled < len(self.parts) and self.parts[self.settled].done():
            self.parts[self.settled].result()  # a part that failed fails the file now rather than at close
            self.settled += 1
        common = {"Bucket": self.bucket, "Key": self.key, "UploadId": self.upload_id,
                  "PartNumber": len(self.parts) + 1}
        self.parts.append(self.pool.submit(call, common))

    def _shutdown(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)
            self.pool = None
