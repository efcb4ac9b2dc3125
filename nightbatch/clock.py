"""Wall-clock time in whole seconds, the unit of every OpenAI timestamp."""

from __future__ import annotations

import time


def now() -> int:
    return int(time.time())


def sort_key(created_at: int, item_id: str) -> str:
    """Orders items by creation time with the id as tie-breaker (string order = time order)."""
    return f"{created_at:012d}#{item_id}"
