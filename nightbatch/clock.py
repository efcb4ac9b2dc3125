"""Wall-clock time in whole seconds, the unit of every OpenAI timestamp."""

from __future__ import annotations

import time


def now() -> int:
    return int(time.time())


def sort_key(created_at: int, item_id: str) -> str:
    """Orders items by creation time with the id as tie-breaker (string order = time order)."""
    return f"{created_at:012d}#{item_id}"


_last_ns = 0


def listing_key(created_at: int, item_id: str) -> str:
    """A listing's order, fixed when an item is made: its creation second, then the nanosecond it was made (two
    items made in one second list newest first, not by their random ids), then the id. Strictly increasing within
    a process; a `sort_key` 0.1.x wrote (`<second>#<id>`) of the same second sorts before (`#` < `.`)."""
    global _last_ns
    _last_ns = max(time.time_ns(), _last_ns + 1)
    return f"{created_at:012d}.{_last_ns:020d}#{item_id}"
