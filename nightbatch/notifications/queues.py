"""Delivery queues: SQS in AWS (nightbatch.aws.delivery_queue), an in-process delayed queue in the local mode.

Both carry the same JSON messages to the same consumer (`Notifier.handle_message`), so the local mode runs the
delivery code path AWS runs.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

log = logging.getLogger("nightbatch.notifications")


class DeliveryQueue(Protocol):
    def send(self, message: dict[str, Any], delay_seconds: float) -> None: ...

    def close(self) -> None: ...


class InProcessQueue:
    """A heap of due times watched by one scheduler thread; a small pool runs the consumer.

    Like SQS with a Lambda consumer, a message whose consumer raises is offered again later, a bounded number
    of times (then it is logged and dropped, as a DLQ would keep it).
    """

    def __init__(
        self, consumer: Callable[[dict[str, Any]], object], *, workers: int = 4, redrive_seconds: float = 1.0,
        max_receives: int = 5,
    ) -> None:
        self.consumer = consumer
        self.redrive_seconds = redrive_seconds
        self.max_receives = max_receives
        self._heap: list[tuple[float, int, dict[str, Any], int]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._running = 0
        self._closed = False
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="webhook")
        self._thread: threading.Thread | None = None

    def send(self, message: dict[str, Any], delay_seconds: float) -> None:
        self._push(message, delay_seconds, 0)

    def _push(self, message: dict[str, Any], delay: float, receives: int) -> None:
        with self._cond:
            if self._closed:
                log.warning("delivery queue closed; dropping %s", message)
                return
            heapq.heappush(self._heap, (time.monotonic() + max(0.0, delay), next(self._seq), message, receives))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="webhook-scheduler", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (not self._heap or self._heap[0][0] > time.monotonic()):
                    self._cond.wait(timeout=self._heap[0][0] - time.monotonic() if self._heap else None)
                if self._closed:
                    return
                _, _, message, receives = heapq.heappop(self._heap)
                self._running += 1
            self._pool.submit(self._consume, message, receives + 1)

    def _consume(self, message: dict[str, Any], receives: int) -> None:
        try:
            self.consumer(message)
        except Exception:
            if receives < self.max_receives:
                log.exception("webhook delivery failed; offering it again in %.1f s", self.redrive_seconds)
                self._push(message, self.redrive_seconds, receives)
            else:
                log.exception("webhook delivery failed %d times; dropping %s", receives, message)
        finally:
            with self._cond:
                self._running -= 1
                self._cond.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """True once nothing is queued or running (tests and a graceful local shutdown)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._heap or self._running:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(timeout=left)
            return True

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._pool.shutdown(wait=False, cancel_futures=True)
