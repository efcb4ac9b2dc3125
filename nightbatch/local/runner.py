"""The in-process workflow: the state machine's steps, in the same order, on threads of this process."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

from nightbatch.storage import Adapters

log = logging.getLogger("nightbatch.local")


class LocalWorkflow:
    def __init__(self, adapters: Adapters, *, engines: bool = True) -> None:
        self.adapters = adapters
        self.engines_enabled = engines
        self.pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="batch")
        self.stopping = threading.Event()

    def start(self, batch_id: str) -> None:
        self.pool.submit(self._run, batch_id)

    def _run(self, batch_id: str) -> None:
        log.info("batch %s accepted (execution arrives with the pipeline)", batch_id)

    def warm_up_in_background(self) -> None:
        pass

    def stop(self) -> None:
        self.stopping.set()
        self.pool.shutdown(wait=False, cancel_futures=True)
