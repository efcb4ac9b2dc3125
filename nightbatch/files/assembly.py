"""Composition of uploaded files: after /complete returned, the ordered parts become one S3 object.

A completed upload's File item carries `parts` (the part keys in order) and reads through them; the compose
step writes the one object at the item's `s3_key`, drops `parts`, and deletes the part objects after a grace
period (readers that fetched the item earlier may still be streaming through the parts). When /complete could
not check the caller's md5 in time, the compose step checks it: a mismatch marks the File `status: "error"`,
which makes it unusable (downloads and batch creation refuse it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from nightbatch.aws import Table
from nightbatch.aws.parts import PartStore
from nightbatch.aws.records import FileRecord
from nightbatch.clock import now
from nightbatch.errors import StorageConflictError
from nightbatch.layout import INPUT_TAG_KEY, INPUT_TAGS, upload_prefix
from nightbatch.settings import Settings
from nightbatch.tenancy.scope import tenant_tags

log = logging.getLogger("nightbatch.files.uploads")


class UploadJobs(Protocol):
    """Where composition runs: an SQS queue read by the compose-upload task in AWS, a thread locally."""

    def compose(self, file_id: str, upload_id: str, *, delay_seconds: float = 0.0) -> None: ...

    def purge_parts(self, upload_id: str, *, delay_seconds: float = 0.0) -> None: ...


@dataclass(kw_only=True)
class AssemblyService:
    settings: Settings
    table: Table
    parts: PartStore
    jobs: UploadJobs

    def compose(self, file_id: str, upload_id: str) -> str:
        """Idempotent (a queue may deliver twice). Returns what happened, for the logs."""
        item = self.table.get_record(FileRecord, file_id)
        if item is None:
            self.purge(upload_id)
            return "file deleted"
        keys = list(item.parts or [])
        if not keys:
            self.jobs.purge_parts(upload_id, delay_seconds=self.settings.uploads.parts_grace_seconds)
            return "already composed"
        sizes = self.parts.sizes(upload_prefix(upload_id))
        missing = [k for k in keys if k not in sizes]
        if missing:
            log.error("cannot compose %s: parts missing %s", file_id, missing[:3])
            return "parts missing"
        outcome = "composed"
        if item.md5_expected:
            outcome = self._verify(file_id, keys, item.md5_expected)
        # The composed object carries its tenant from the start, as the parts do (tenancy/scope.py); and a batch
        # validated on the parts tagged them as its input (pipeline/validate.py): the composed object the worker
        # switches to must carry that tag too.
        tags = {**tenant_tags(item.tenant), **self._input_tags(keys[0])}
        # The parts read at the ETags the Upload's completion accepted (nightbatch/files/inputs.py): a part
        # changed since fails the composition, and the file keeps reading (and failing) through its parts.
        etag = self.parts.compose(item.s3_key, [(k, sizes[k]) for k in keys], tags=tags,
                                  etags=dict(zip(keys, item.part_etags or [], strict=False)))
        try:
            self.table.update_attributes(FileRecord, file_id, set_={"composed_at": now(), "etag": etag},
                                         remove=("parts", "part_etags"))
        except StorageConflictError:
            # Deleted while composing: nothing may outlive the item.
            self.parts.blobs.delete(item.s3_key)
            self.purge(upload_id)
            return "file deleted"
        # Read again once `parts` is gone: a Validate that tagged the parts after the read above finds the item
        # composed when it checks, after its tagging, and tags the object itself; one that tagged them before this
        # read is seen here. Either way the object ends up tagged.
        if INPUT_TAG_KEY not in tags and (more := self._input_tags(keys[0])):
            self.parts.blobs.tag(item.s3_key, more)  # added to the tenant's tag
        self.jobs.purge_parts(upload_id, delay_seconds=self.settings.uploads.parts_grace_seconds)
        log.info("upload %s composed into %s (%s)", upload_id, file_id, outcome)
        return outcome

    def _input_tags(self, part: str) -> dict[str, str]:
        return INPUT_TAGS if self.parts.blobs.tags(part).get(INPUT_TAG_KEY) == INPUT_TAGS[INPUT_TAG_KEY] else {}

    def _verify(self, file_id: str, keys: list[str], expected: str) -> str:
        actual = self.parts.md5(keys)
        try:
            if actual == expected:
                self.table.update_attributes(FileRecord, file_id, remove=("status", "md5_expected"))
                return "composed, md5 verified"
            self.table.update_attributes(FileRecord, file_id, set_={
                "status": "error",
                "status_details": f"The md5 given at upload completion ({expected}) does not match the "
                                  f"uploaded bytes ({actual}). This file cannot be used; upload it again.",
            }, remove=("md5_expected",))
        except StorageConflictError:
            pass  # deleted meantime; compose() cleans up
        return "md5 mismatch"

    def purge(self, upload_id: str) -> None:
        self.parts.blobs.delete_prefix(upload_prefix(upload_id))


class ThreadUploadJobs:
    """The local mode's UploadJobs: composition on one worker thread of this process, purges on timers."""

    def __init__(self) -> None:
        self._assembly: AssemblyService | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="compose")
        self._timers: set[threading.Timer] = set()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._queued = 0

    def bind(self, assembly: AssemblyService) -> None:
        self._assembly = assembly

    def compose(self, file_id: str, upload_id: str, *, delay_seconds: float = 0.0) -> None:
        self._submit(delay_seconds, lambda a: a.compose(file_id, upload_id))

    def purge_parts(self, upload_id: str, *, delay_seconds: float = 0.0) -> None:
        if delay_seconds <= 0:
            self._submit(0.0, lambda a: a.purge(upload_id))
            return
        timer = threading.Timer(delay_seconds, self._fire, args=(upload_id,))
        timer.daemon = True
        with self._lock:
            self._timers.add(timer)
        timer.start()

    def _fire(self, upload_id: str) -> None:
        with self._lock:
            self._timers = {t for t in self._timers if t.is_alive() and t is not threading.current_thread()}
        self._run(0.0, lambda a: a.purge(upload_id))

    def _submit(self, delay_seconds: float, job: Callable[[AssemblyService], Any]) -> None:
        with self._lock:
            self._queued += 1
        self._pool.submit(self._queued_run, delay_seconds, job)

    def _queued_run(self, delay_seconds: float, job: Callable[[AssemblyService], Any]) -> None:
        try:
            self._run(delay_seconds, job)
        finally:
            with self._idle:
                self._queued -= 1
                self._idle.notify_all()

    def _run(self, delay_seconds: float, job: Callable[[AssemblyService], Any]) -> None:
        if delay_seconds > 0:
            time.sleep(delay_seconds)
        if self._assembly is None:
            log.error("upload jobs not bound to an assembly service")
            return
        try:
            job(self._assembly)
        except Exception:
            # The file stays readable through its parts; the next compose request retries.
            log.exception("upload job failed")

    def drain(self, timeout: float = 60.0) -> None:
        """Waits until no composition or immediate purge is queued or running (tests, shutdown)."""
        with self._idle:
            if not self._idle.wait_for(lambda: self._queued == 0, timeout=timeout):
                raise TimeoutError("upload jobs still running")

    def stop(self) -> None:
        with self._lock:
            for t in self._timers:
                t.cancel()
            self._timers.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)
