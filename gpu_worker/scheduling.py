"""Submission order for a shard: shared prompt prefixes together, longest first, within a bounded window.

vLLM caches the KV blocks of a prompt prefix only while some request still holds them (or until they are
evicted), and computes a long prompt's prefill in the step it is admitted. So the runner reads a bounded
window of pending lines ahead, and submits them (a) grouped so that requests whose prompts begin with the
same text reach the engine together (their shared blocks are computed once and stay referenced), and (b)
longest first, so that the end of a shard is not one long prefill running alone. The next window is read
from S3 on a background thread while the current one runs.

Every knob is a setting (docs/CONFIGURATION.md), so that the worker bench (docs/BENCHMARKS.md) can show what each
one buys.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

from nightbatch.pipeline.prefixes import prompt_text
from nightbatch.settings import Settings
from nightbatch.validation.line import RequestLine

LengthOrder = Literal["longest", "shortest", "none"]


@dataclass(frozen=True)
class OrderPolicy:
    """How one window of pending requests is ordered; window_lines == 0 keeps input order, unwindowed."""

    window_lines: int = 4096
    window_chars: int = 64 * 1024 * 1024
    group_prefixes: bool = True
    prefix_chars: int = 256
    length_order: LengthOrder = "longest"

    @classmethod
    def from_settings(cls, settings: Settings) -> OrderPolicy:
        return cls(
            window_lines=max(0, settings.worker.order_window_lines),
            window_chars=max(1, settings.worker.order_window_chars),
            group_prefixes=settings.worker.group_prefixes,
            prefix_chars=max(1, settings.worker.prefix_chars),
            length_order=settings.worker.length_order,
        )

    @property
    def reorders(self) -> bool:
        return self.window_lines > 0 and (self.group_prefixes or self.length_order != "none")


@dataclass(frozen=True)
class _Keyed:
    prefix: str
    length: int
    request: RequestLine


def _keyed(request: RequestLine, policy: OrderPolicy) -> _Keyed:
    text = prompt_text(request.body)
    return _Keyed(prefix=text[: policy.prefix_chars] if policy.group_prefixes else "", length=len(text),
                  request=request)


def _sorted(window: list[_Keyed], policy: OrderPolicy) -> list[RequestLine]:
    """Groups of a shared prefix stay contiguous; groups go in the order of their longest (shortest) member and
    members longest (shortest) first, so the window runs longest first overall. With length_order "none",
    groups go in order of first appearance. Python's sort is stable: ties keep input order."""
    if not policy.reorders:
        return [k.request for k in window]
    sign = {"longest": -1, "shortest": 1, "none": 0}[policy.length_order]
    if not policy.group_prefixes:
        return [k.request for k in sorted(window, key=lambda k: sign * k.length)]
    lead: dict[str, int] = {}
    for i, k in enumerate(window):
        value = sign * k.length if sign else i
        if value < lead.get(k.prefix, value + 1):
            lead[k.prefix] = value
    return [k.request for k in sorted(window, key=lambda k: (lead[k.prefix], k.prefix, sign * k.length))]


def order_window(window: Iterable[RequestLine], policy: OrderPolicy) -> list[RequestLine]:
    """One window in submission order."""
    return _sorted([_keyed(request, policy) for request in window], policy)


def _read_window(requests: Iterator[RequestLine], policy: OrderPolicy) -> list[_Keyed]:
    """The next window: at most window_lines requests and about window_chars of prompt text (memory bound)."""
    window: list[_Keyed] = []
    chars = 0
    for request in requests:
        window.append(_keyed(request, policy))
        chars += window[-1].length
        if len(window) >= policy.window_lines or chars >= policy.window_chars:
            break
    return window


def ordered(requests: Iterable[RequestLine], policy: OrderPolicy) -> Iterator[RequestLine]:
    """Every request exactly once, window by window in policy order; the next window is read from storage on
    a background thread while this one is handed out. At most two windows are held at a time."""
    source = iter(requests)
    if policy.window_lines <= 0:
        yield from source
        return
    pool = ThreadPoolExecutor(1, thread_name_prefix="read-ahead")
    try:
        upcoming: Future[list[_Keyed]] = pool.submit(_read_window, source, policy)
        while True:
            window = upcoming.result()
            if not window:
                return
            upcoming = pool.submit(_read_window, source, policy)
            batch = _sorted(window, policy)
            del window
            yield from batch
    finally:
        # A stopped shard drops this generator from the event loop's thread: never block it on a read.
        pool.shutdown(wait=False, cancel_futures=True)


def in_flight_limit(settings: Settings, engine: object) -> int:
    """Requests to keep in the engine. run_batch submits a whole file at once; we bound memory instead, but
    never below `worker_in_flight_per_slot` requests per engine sequence slot, so the engine's scheduler
    always has waiting requests to fill a step's token budget with (a GPU engine may run 1024 sequences,
    more than the static default)."""
    limit = max(1, settings.worker.max_in_flight)
    slots = getattr(engine, "max_num_seqs", None)
    if isinstance(slots, int) and slots > 0 and settings.worker.in_flight_per_slot > 0:
        limit = max(limit, math.ceil(slots * settings.worker.in_flight_per_slot))
    return limit
