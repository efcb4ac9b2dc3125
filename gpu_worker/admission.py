"""Admission to an online server: AIMD concurrency per endpoint, so a batch takes the spare capacity and gives it
back as soon as the server says it has none.

One `Admission` per endpoint in a process (gpu_worker/engines/endpoint_engine.py shares it); every request to the
endpoint holds one of its slots from send to answer. The limit:
- starts at `initial`, never below `floor` nor above `ceiling`;
- additive increase: +`increase` after each window of as many successes as the current limit (about one round trip
  of the whole window), and only while the server is not saturated;
- multiplicative decrease: times `decrease` on an overload answer (429, 503, a gateway's 502/504, a timeout, a refused
  connection), at most once per round: an answer to a request sent before the last decrease says nothing about the
  limit that decrease set; and on each saturated reading of the server's metrics (gpu_worker/saturation.py);
- `Retry-After` holds every new request to the endpoint until it has passed (`hold`).

The llm-d batch gateway's flow control is the model (floor 5, halve on 429/5xx, +1 on sustained success; a
saturation detector at queue depth 5 or KV cache 0.8); the figures here are settings (nightbatch/settings/admission.py).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from nightbatch.settings import AdmissionSettings


class Outcome(Enum):
    SUCCESS = "success"  # the server answered (any answer that is the line's result)
    OVERLOAD = "overload"  # the server could not take it now: decrease, retry later
    NEUTRAL = "neutral"  # neither (a cancelled request): the slot is freed, the limit left alone


@dataclass(frozen=True)
class AdmissionPolicy:
    floor: int = 2
    ceiling: int = 64
    initial: int = 8
    decrease: float = 0.5
    increase: float = 1.0

    def __post_init__(self) -> None:
        if not 1 <= self.floor <= self.ceiling:
            raise ValueError(f"admission: floor {self.floor} must be >= 1 and <= ceiling {self.ceiling}")
        if not 0 < self.decrease < 1 or self.increase <= 0:
            raise ValueError("admission: decrease must be in (0, 1) and increase > 0")

    @classmethod
    def from_settings(cls, settings: AdmissionSettings, *, ceiling: int | None = None) -> AdmissionPolicy:
        top = ceiling or settings.ceiling
        floor = min(settings.floor, top)
        return cls(floor=floor, ceiling=top, initial=max(floor, min(top, settings.initial)),
                   decrease=settings.decrease, increase=settings.increase)


@dataclass
class AdmissionStats:
    """What the limit did, for logs, tests and the bench."""

    decreases: int = 0
    increases: int = 0
    overloads: int = 0
    saturated_reads: int = 0
    lowest: float = math.inf
    highest: float = 0.0


class Admission:
    """The AIMD window of one endpoint: `acquire` waits for a slot, `release` reports how the request went.

    Used from one event loop at a time (the worker's, or the local stack's engine loop)."""

    def __init__(self, policy: AdmissionPolicy, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self.clock = clock
        self.limit = float(policy.initial)
        self.in_flight = 0
        self.saturated = False
        self.stats = AdmissionStats(lowest=self.limit, highest=self.limit)
        self._successes = 0.0
        self._last_decrease = -math.inf
        self._held_until = -math.inf
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._timer: asyncio.TimerHandle | None = None

    @property
    def slots(self) -> int:
        """Requests that may be in flight now."""
        return max(self.policy.floor, int(self.limit))

    @property
    def held_for(self) -> float:
        """Seconds until new requests may go (a Retry-After still running), else 0."""
        return max(0.0, self._held_until - self.clock())

    def try_acquire(self) -> float | None:
        """A free slot now (its send time), or None."""
        if self.in_flight >= self.slots or self.held_for > 0 or self._waiters:
            return None
        self.in_flight += 1
        return self.clock()

    async def acquire(self) -> float:
        """Waits for a free slot (and for any hold to pass); returns the send time `release` needs."""
        while self.in_flight >= self.slots or self.held_for > 0:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            self._arm_timer()
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # it was woken for a slot it will not take: pass it on
                raise
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
        self.in_flight += 1
        return self.clock()

    def release(self, sent_at: float, outcome: Outcome, *, retry_after: float | None = None) -> None:
        """The request sent at `sent_at` (acquire's answer) ended so; frees its slot."""
        self.in_flight = max(0, self.in_flight - 1)
        if outcome is Outcome.SUCCESS:
            self._success()
        elif outcome is Outcome.OVERLOAD:
            self.stats.overloads += 1
            if sent_at >= self._last_decrease:  # one decrease per round, not one per answer of the same round
                self._decrease()
        if retry_after is not None and retry_after > 0:
            self.hold(retry_after)
        self._wake()

    def hold(self, seconds: float) -> None:
        """No new request goes for `seconds` (a Retry-After); in-flight ones run on."""
        self._held_until = max(self._held_until, self.clock() + seconds)
        self._arm_timer()

    def report_saturation(self, saturated: bool) -> None:
        """One reading of the server's load: saturated decreases the limit and stops its growth until a reading
        says otherwise."""
        self.saturated = saturated
        if saturated:
            self.stats.saturated_reads += 1
            self._decrease()
        self._wake()

    def _success(self) -> None:
        if self.saturated:
            return
        self._successes += 1
        if self._successes >= self.limit and self.limit < self.policy.ceiling:
            self._successes = 0.0
            self._set(min(float(self.policy.ceiling), self.limit + self.policy.increase))
            self.stats.increases += 1

    def _decrease(self) -> None:
        self._last_decrease = self.clock()
        self._successes = 0.0
        lowered = max(float(self.policy.floor), self.limit * self.policy.decrease)
        if lowered < self.limit:
            self.stats.decreases += 1
        self._set(lowered)

    def _set(self, limit: float) -> None:
        self.limit = limit
        self.stats.lowest = min(self.stats.lowest, limit)
        self.stats.highest = max(self.stats.highest, limit)

    def _wake(self) -> None:
        """Lets as many waiters go as there are free slots (none while held: the timer wakes them)."""
        if self.held_for > 0:
            self._arm_timer()
            return
        free = self.slots - self.in_flight
        for waiter in list(self._waiters):
            if free <= 0:
                break
            if not waiter.done():
                waiter.set_result(None)
                free -= 1

    def _arm_timer(self) -> None:
        """Wakes the waiters when a hold ends (a timer that fires early re-arms itself through _wake)."""
        held = self.held_for
        if held <= 0 or not self._waiters or self._timer is not None:
            return
        self._timer = asyncio.get_running_loop().call_later(held, self._on_timer)

    def unbind(self) -> None:
        """Forgets what belongs to the event loop it last ran on (a timer, waiters), keeping the limit: the next
        user may run on another loop."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        self._waiters.clear()

    def _on_timer(self) -> None:
        self._timer = None
        self._wake()
