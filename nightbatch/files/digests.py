"""Running md5s of uploads whose parts arrive one after another, kept in this process.

A hash object's state cannot be stored in the table, so the digest lives where the parts arrive: `fork`
before a part is hashed, `advance` once the part is registered. If two parts of one upload overlap in time,
or the process never saw the upload begin, there is no running digest and the compose step checks the md5
(/complete never re-reads the parts).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# An md5 object is ~100 bytes; the bound only stops abandoned uploads from accumulating.
CAPACITY = 1024


@dataclass
class _Running:
    digest: Any | None
    part_ids: list[str] = field(default_factory=list)


class RunningDigests:
    def __init__(self, capacity: int = CAPACITY) -> None:
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, _Running] = OrderedDict()
        self._capacity = capacity

    def start(self, upload_id: str) -> None:
        with self._lock:
            self._entries[upload_id] = _Running(hashlib.md5(usedforsecurity=False))
            while len(self._entries) > self._capacity:
                self._entries.popitem(last=False)

    def fork(self, upload_id: str) -> tuple[Any | None, int]:
        """A copy of the running digest to feed the next part into, and how many parts it already holds."""
        with self._lock:
            entry = self._entries.get(upload_id)
            if entry is None or entry.digest is None:
                return None, -1
            self._entries.move_to_end(upload_id)
            return entry.digest.copy(), len(entry.part_ids)

    def advance(self, upload_id: str, base: int, digest: Any, part_id: str) -> None:
        with self._lock:
            entry = self._entries.get(upload_id)
            if entry is None or entry.digest is None:
                return
            if len(entry.part_ids) != base:
                # Another part landed since this one forked: arrival order is no longer one sequence.
                entry.digest = None
                return
            entry.digest = digest
            entry.part_ids.append(part_id)

    def hexdigest(self, upload_id: str, part_ids: Sequence[str]) -> str | None:
        """The md5 of the parts, if they arrived in exactly the order `part_ids` lists them."""
        with self._lock:
            entry = self._entries.get(upload_id)
            if entry is None or entry.digest is None or entry.part_ids != list(part_ids):
                return None
            return str(entry.digest.hexdigest())

    def forget(self, upload_id: str) -> None:
        with self._lock:
            self._entries.pop(upload_id, None)
