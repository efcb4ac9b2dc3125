"""A batch's input as it was accepted: which version of each of its objects, the one reader of those versions, and
what it means when one can no longer be read.

The version accepted, recorded when the file is made and read by every reader after (Validate, the worker, the
content route, retry, the estimate):
- an in-place input (files/user_buckets.py): each object's ETag, and its VersionId where the bucket is versioned,
  as the create's HEAD or listing saw them (a listing gives no VersionId: the first read records it, and
  Validate keeps it on the file);
- a file we stored (POST /v1/files, a retry's input, the Anthropic wire's inline requests): its object's ETag as
  written (FileRecord.etag);
- an Upload: its parts' ETags when it was completed (FileRecord.part_etags), then the object composition
  writes from those parts, read at those ETags (nightbatch/files/assembly.py); its ETag is recorded on the file,
  and a reader that met the Upload in parts takes it from the listing that shows the composition finished.
Every GET sends the ETag as If-Match and, where known, the VersionId (storage.s3.Version): in a versioned bucket
an overwrite or a delete leaves the accepted version readable, elsewhere S3 refuses the read. A refusal is
`InputUnavailable`: `input_changed` (412: other bytes now; 404: deleted; 416: shorter) or `input_unreadable`
(403: a bucket policy, a key, the Glacier storage class). Validate fails the batch with it, the worker ends each
line it can no longer read with it (nightbatch/shards/lines.py), the content route and retry answer it
as a 409. A file 0.1.x made without an ETag is read as it is, and pinned from its first read on (that reading
may go in 0.3: docs/ARCHITECTURE.md "Versions of the hand-off records").

Our own object is rewritten in place by Validate when the bucket's lifecycle would delete it before the batch
ends (`keep`): same bytes, a new ETag. The rewrite keeps the ETags the object had in its metadata (KEPT_ETAGS),
and a reader whose If-Match meets a rewritten object takes its new ETag from there: other batches reading the
same file never see their own deployment's rewrite as a change.

An in-place input's objects are JSONL documents of their own: a BOM at the start of each is dropped, as at the
start of a file, and each one's end ends its last line; lines are numbered on across them, and an error names
the object (`InputReader.where`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from nightbatch.aws import BlobStore
from nightbatch.aws.botoerrors import answer, client_error
from nightbatch.aws.parts import PartStore
from nightbatch.aws.s3 import CHUNK_BYTES, Version
from nightbatch.errors import ConflictError
from nightbatch.files.sources import InputPart, InputSource, source_parts
from nightbatch.jsonl import LineBlock, RawLine, lines_of, split_blocks

if TYPE_CHECKING:
    from nightbatch.aws.records import FileRecord
    from nightbatch.tenancy.scope import Scope

INPUT_CHANGED = "input_changed"
INPUT_UNREADABLE = "input_unreadable"
# Object metadata of our own input rewritten in place (`keep`): the ETags it had before, oldest first.
KEPT_ETAGS = "nightbatch-etags"
KEPT_FOR = "nightbatch-kept-for"
MAX_KEPT_ETAGS = 40  # S3 user metadata is at most 2 KB: the most recent ones (older pins are long done)
_CHECKS = 8  # HEADs in flight when an input is checked before it is served


class InputUnavailable(ConflictError):
    """The version of an input object that was accepted cannot be read any more. `code`: INPUT_CHANGED or
    INPUT_UNREADABLE; `name`: the object as a user knows it; `why`: what S3 answered, in words. Met in an API
    call, a 409 saying so; in a step, an error of the batch's data (Finalize does not retry it as AWS's)."""

    code: str

    def __init__(self, code: str, name: str, why: str) -> None:
        self.name, self.why = name, why
        super().__init__(f"The input object {name} {why}." if name else f"The input {why}.", code=code)

    def line_message(self, number: int) -> str:
        subject = f"its input object {self.name}" if self.name else "its input"
        return f"Line {number} was not run: {subject} {self.why}."


def unavailable(status: int, code: str, name: str, version: Version) -> InputUnavailable | None:
    """What a refused read of an input object means (S3's HTTP status and error code), or None when S3 or the
    network failed (retried as any such failure)."""
    if status == 412 or code == "PreconditionFailed":
        return InputUnavailable(INPUT_CHANGED, name, f"changed after the batch accepted it (it is no longer the "
                                                     f"object of ETag {version.etag})")
    if code == "NoSuchVersion" or (status == 404 and version.version_id and code != "NoSuchBucket"):
        return InputUnavailable(INPUT_CHANGED, name, f"no longer has the version the batch accepted "
                                                     f"({version.version_id}): it was deleted")
    if status == 404 or code in ("NoSuchKey", "NoSuchBucket", "NotFound"):
        return InputUnavailable(INPUT_CHANGED, name, "was deleted after the batch accepted it")
    if status == 416 or code == "InvalidRange":
        return InputUnavailable(INPUT_CHANGED, name, "is shorter than when the batch accepted it")
    if status == 403:
        return InputUnavailable(INPUT_UNREADABLE, name, f"can no longer be read by this deployment "
                                                        f"({code or 'AccessDenied'})")
    return None


def input_source(blobs: BlobStore, rec: FileRecord) -> InputSource:
    """What a file's bytes are, at the versions accepted: a user's objects, an Upload's parts (sizes by one
    listing) while it is not composed, else its one object."""
    if rec.source_objects:
        return InputSource(key="", bytes=rec.bytes, parts=source_parts(rec), in_place=True)
    source = InputSource(key=rec.s3_key, bytes=rec.bytes, etag=rec.etag or "")
    if rec.parts:
        listed = PartStore(blobs).listing(os.path.commonpath(rec.parts))  # the Upload's parts (one listing)
        etags = rec.part_etags or []
        missing = [k for k in rec.parts if k not in listed]
        if not missing:
            source.parts = [InputPart(key=k, bytes=listed[k][0], etag=etags[i] if i < len(etags) else "")
                            for i, k in enumerate(rec.parts)]
        elif PartStore(blobs).sizes(rec.s3_key).get(rec.s3_key) != rec.bytes:
            raise InputUnavailable(INPUT_CHANGED, missing[0], "was deleted after the batch accepted it")
        # Else the parts were purged once composed (the record was read before that): read the composed object.
    return source


class InputReader:
    """The logical bytes of an input at the versions accepted: its one object, an Upload's parts until it is
    composed, or a user's objects read in place. Pins missing from `source` (records 0.1.x wrote, an
    object's VersionId) are learnt from the first read and kept (`pinned`); a part that failed fails again
    without another GET."""

    def __init__(self, blobs: BlobStore, source: InputSource, *, scope: Scope | None = None) -> None:
        self.blobs, self.source = blobs, source
        # The tenant on whose behalf a shard reads (the GPU worker's reader): each object is checked against it
        # before its first GET (`_check_owner`). None: a reader that found the file through the tenant's own
        # record (the API, Validate, retry), or a shard planned before specs named their tenant.
        self.scope = scope
        self.owned: set[int] = set()
        self.parts = list(source.parts)
        self.versions = [Version(p.etag, p.version_id) for p in self.parts]
        self.whole = Version(source.etag)
        self.composed = not source.parts
        self.failed: dict[int, InputUnavailable] = {}  # by part index; -1: the composed object
        self.starts: list[tuple[int, str]] = []  # (first line number, object) of each document read by `blocks`

    def pinned(self) -> InputSource:
        """`source` with every pin learnt so far: what the shards and Finalize read by."""
        parts = [p.model_copy(update={"etag": v.etag, "version_id": v.version_id})
                 for p, v in zip(self.parts, self.versions, strict=True)]
        return self.source.model_copy(update={"parts": parts, "etag": self.whole.etag})

    def name(self, index: int) -> str:
        """The object as a user knows it: a user's `s3://` URI, else our key (a file's object, an Upload's part)."""
        if index < 0:
            return self.source.key
        part = self.parts[index]
        return f"s3://{part.bucket}/{part.key}" if self.source.in_place else part.key

    # -- bytes ---------------------------------------------------------------------------------------------

    def stream(self, start: int, end: int, *, read_ahead: bool = False, chunk: int = CHUNK_BYTES) -> Iterator[bytes]:
        """The bytes [start, end) of the input, one GET per object it spans; InputUnavailable where an object's
        accepted version cannot be read (after the bytes before it)."""
        at = start
        while at < end:
            if not self.composed and not self.source.in_place:
                self._composed_now()
            if self.composed:
                yield from self._get(-1, at, end, read_ahead, chunk)
                return
            try:
                off = 0
                for i, part in enumerate(self.parts):
                    lo, hi = max(at, off), min(end, off + part.bytes)
                    if lo < hi:
                        for piece in self._get(i, lo - off, hi - off, read_ahead, chunk):
                            at += len(piece)
                            yield piece
                    off += part.bytes
                return
            except InputUnavailable:
                # An Upload's part gone: its parts are purged once it is composed.
                if self.source.in_place or not self._composed_now():
                    raise

    def spans(self, start: int, end: int) -> list[tuple[int, int]]:
        """[start, end) cut where one object ends and the next begins (none once it is one object): read span by
        span, the bytes of an object are had before a later object's GET can fail."""
        if self.composed:
            return [(start, end)]
        cuts, at = [], 0
        for part in self.parts[:-1]:
            at += part.bytes
            if start < at < end:
                cuts.append(at)
        return list(zip([start, *cuts], [*cuts, end], strict=True))

    def _composed_now(self) -> bool:
        # By listing, not HEAD: the worker may list the input prefix but a HEAD of a missing key answers 403.
        listed = PartStore(self.blobs).listing(self.source.key).get(self.source.key)
        if listed is not None and listed[0] == self.source.bytes:
            self.composed = True  # the parts may be purged from now on
            self.whole.learn({"ETag": listed[1]})
        return self.composed

    def _target(self, index: int) -> tuple[BlobStore, str, Version]:
        if index < 0:
            return self.blobs, self.source.key, self.whole
        part = self.parts[index]
        return self.blobs.in_bucket(part.bucket), part.key, self.versions[index]

    def _check_owner(self, index: int) -> None:
        """InputUnavailable (input_unreadable) unless the object may be read for the scope's tenant: a user's
        object under the tenant's allow-list entries, our own object tagged with the tenant (every input of ours
        is: at upload, and by Validate; nightbatch/tenancy/scope.py)."""
        if self.scope is None or index in self.owned:
            return
        store, key, _ = self._target(index)
        if self.source.in_place:
            ok = self.scope.may_read(store.bucket, key)
        else:
            try:
                ok = self.scope.owns(store.tags(key))
            except client_error() as e:
                status, code = answer(e)
                failure = self._failure(status, code, index)
                if failure is None:
                    raise
                self.failed[index] = failure
                raise failure from e
        if not ok:
            self.owned.add(index)  # for the probe's own GET: a rewritten object lost our tags with its bytes
            try:
                self._first_byte(index)  # its accepted version gone: that is what ends its lines
            finally:
                self.owned.discard(index)
            failure = InputUnavailable(INPUT_UNREADABLE, self.name(index), "is not one this batch's tenant "
                                       f"'{self.scope.tenant}' may read")
            self.failed[index] = failure
            raise failure
        self.owned.add(index)

    def _get(self, index: int, lo: int, hi: int, read_ahead: bool, chunk: int) -> Iterator[bytes]:
        if index in self.failed:
            raise self.failed[index]
        self._check_owner(index)
        store, key, version = self._target(index)
        renewed = False
        while True:
            sent = False
            try:
                read = store.iter_chunks_ahead if read_ahead else store.iter_chunks
                for piece in read(key, start=lo, end=hi, chunk=chunk, version=version):
                    sent = True
                    yield piece
                return
            except client_error() as e:
                status, code = answer(e)
                failure = self._failure(status, code, index)
                if failure is None:
                    raise
                if not sent and not renewed and status == 412:
                    renewed = self._renewed(index)
                    if renewed:
                        continue
                self.failed[index] = failure
                raise failure from e

    def _failure(self, status: int, code: str, index: int) -> InputUnavailable | None:
        store, key, version = self._target(index)
        failure = unavailable(status, code, self.name(index), version)
        if failure is not None and failure.code == INPUT_UNREADABLE and not self._listed(store, key):
            # A role that may not list where it reads is answered 403 for a missing key, not 404.
            failure = InputUnavailable(INPUT_CHANGED, failure.name, "was deleted after the batch accepted it")
        return failure

    @staticmethod
    def _listed(store: BlobStore, key: str) -> bool:
        try:
            return key in PartStore(store).sizes(key)
        except client_error():
            return True  # not even listable: say what the read was answered

    def _renewed(self, index: int) -> bool:
        """Our own object rewritten in place with the same bytes (`keep`): its new ETag, when the object's
        metadata lists the one this read was pinned to. Never for a user's object."""
        if self.source.in_place:
            return False
        store, key, version = self._target(index)
        try:
            head = store.head(key)
        except client_error():
            return False
        earlier = str(((head or {}).get("Metadata") or {}).get(KEPT_ETAGS, "")).split()
        if head is None or version.etag.strip('"') not in earlier:
            return False
        version.etag = str(head["ETag"])
        return True

    def check(self) -> None:
        """InputUnavailable now, rather than once its bytes are on their way: the first byte of each object read
        at its accepted version, as the bytes will be (a HEAD is not always refused where a GET is; the content
        route asks before it answers)."""
        if not self.composed and not self.source.in_place:
            self._composed_now()
        targets = [-1] if self.composed else list(range(len(self.parts)))
        with ThreadPoolExecutor(min(_CHECKS, len(targets)) or 1) as pool:
            list(pool.map(self._first_byte, targets))

    def _first_byte(self, index: int) -> None:
        if (self.source.bytes if index < 0 else self.parts[index].bytes) > 0:
            for _ in self._get(index, 0, 1, False, 1):
                pass

    # -- lines ---------------------------------------------------------------------------------------------

    def documents(self) -> list[tuple[int, int, str]]:
        """(start, end, name) of each JSONL document of the input: each object of an in-place input, else the
        whole input (an Upload's parts cut lines anywhere)."""
        if not self.source.in_place:
            return [(0, self.source.bytes, self.source.key)]
        out, at = [], 0
        for i, part in enumerate(self.parts):
            out.append((at, at + part.bytes, self.name(i)))
            at += part.bytes
        return out

    def blocks(self, *, max_bytes: int, read_ahead: bool = False,
               between: Callable[[], None] | None = None) -> Iterator[RawLine | LineBlock]:
        """split_blocks of each document in turn, numbered and placed in the whole input; `between` is called
        where one document ends and the next begins."""
        documents = self.documents()
        if len(documents) == 1:
            start, end, name = documents[0]
            self.starts.append((1, name))
            yield from split_blocks(self.stream(start, end, read_ahead=read_ahead), max_bytes=max_bytes)
            return
        base = 0
        for n, (start, end, name) in enumerate(documents):
            if n and between is not None:
                between()
            self.starts.append((base + 1, name))
            last = 0
            for item in split_blocks(self.stream(start, end, read_ahead=read_ahead), max_bytes=max_bytes):
                last = item.number + len(item.lines) - 1 if isinstance(item, LineBlock) else item.number
                yield item._replace(number=item.number + base, offset=item.offset + start)
            base += last

    def lines(self, *, max_bytes: int, read_ahead: bool = False) -> Iterator[RawLine]:
        """`blocks`, line by line (nightbatch.jsonl.split_lines of each document)."""
        return lines_of(self.blocks(max_bytes=max_bytes, read_ahead=read_ahead), max_bytes)

    def where(self, number: int) -> str | None:
        """Which object line `number` of an input of several objects is in, and its line there."""
        if len(self.starts) < 2:
            return None
        first, name = next(s for s in reversed(self.starts) if s[0] <= number)
        return f"{name}, its line {number - first + 1}"


def keep(blobs: BlobStore, key: str, etag: str, batch_id: str, tags: dict[str, str]) -> str:
    """Our object `key`, still of ETag `etag`, written again in place (same bytes, written now: the bucket's
    lifecycle counts from then) with `tags`; returns its new ETag. The ETags it had are kept in its metadata, so
    that readers pinned to one of them read on (InputReader._renewed)."""
    head = blobs.head(key, Version(etag))
    assert head is not None
    metadata: dict[str, Any] = head.get("Metadata") or {}
    kept = [*str(metadata.get(KEPT_ETAGS, "")).split(), etag.strip('"')][-MAX_KEPT_ETAGS:]
    blobs.rewrite(key, {KEPT_FOR: batch_id, KEPT_ETAGS: " ".join(kept)}, tags=tags, etag=etag)
    after = blobs.head(key)
    assert after is not None
    return str(after["ETag"])
