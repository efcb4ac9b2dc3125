"""The in-process workflow: the state machine's steps, in the same order, on threads of this process."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from nightbatch.aws import Adapters
from nightbatch.aws.records import BatchRecord
from nightbatch.local.engines import EngineHost
from nightbatch.notifications import Notifier, notify_batch
from nightbatch.pipeline import BatchTaskInput, finalize_batch, plan_batch, validate_batch
from nightbatch.shards.spec import ShardItem, read_manifest, read_shard
from nightbatch.wiring import Services

log = logging.getLogger("nightbatch.local")
SHARD_ATTEMPTS = 2  # the state machine's Retry on States.TaskFailed, then Catch


class LocalWorkflow:
    """Validate → Plan → each shard on the warm engine → Finalize → Notify, like the state machine."""

    def __init__(self, adapters: Adapters, *, engines: bool = True) -> None:
        self.adapters = adapters
        self.engines_enabled = engines
        self.host = EngineHost(adapters.settings, secrets_client=lambda: adapters.client("secretsmanager")
                               ) if engines else None
        self.pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="batch")
        self.stopping = threading.Event()
        self.services: Services | None = None
        self.notifier: Notifier | None = None

    def bind(self, services: Services) -> None:
        self.services = services
        # The Notify step's notifier; its in-process delivery queue lives as long as this workflow (see stop()).
        self.notifier = services.notifier

    def start(self, batch_id: str) -> None:
        self.pool.submit(self._run_logged, batch_id)

    def _run_logged(self, batch_id: str) -> None:
        try:
            self.run(batch_id)
        except Exception:
            log.exception("batch %s: workflow error", batch_id)

    def run(self, batch_id: str) -> None:
        services = self.services
        assert services is not None, "bind() the services first"
        inp = BatchTaskInput(batch_id=batch_id)
        try:
            valid = validate_batch(inp, services).valid
            if valid:
                plan_batch(inp, services)
                for item in read_manifest(services.adapters.blobs, batch_id):
                    self._run_shard(services, item)
        finally:
            # The state machine catches every failure into Finalize, so Finalize always runs.
            if valid_or_open(services, batch_id):
                finalize_batch(inp, services)
        self._notify(services, batch_id)

    def _run_shard(self, services: Services, item: ShardItem) -> None:
        if self.host is None:
            log.warning("engines are off: shard %s of %s not run", item.shard_id, item.batch_id)
            return
        from gpu_worker.runner import ShardJob, run_shard
        from nightbatch.phases import Phases

        job = ShardJob(batch_id=item.batch_id, shard_id=item.shard_id)
        host = self.host
        for attempt in range(1, SHARD_ATTEMPTS + 1):
            if self.stopping.is_set():
                return
            try:
                async def run() -> Any:
                    # The local stack shares one warm engine between shards: a shard's "weights" and "engine"
                    # phases are the wait for it (the whole load for the first shard after start-up).
                    phases = Phases(weights_source="local")
                    shard = read_shard(services.adapters.blobs, job.batch_id, job.shard_id)
                    if shard is None:
                        raise FileNotFoundError(f"no shard {job.shard_id} of {job.batch_id}")
                    batch = services.adapters.table.get_record(BatchRecord, job.batch_id)
                    waited = time.monotonic()
                    # The warm engine (or still starting: the first batch), or the model's endpoint.
                    async with host.shard_engine(shard.model, deadline=batch.expires_at if batch else None) as engine:
                        phases.mark("weights_ready")
                        phases.mark("engine_ready")
                        # Recorded like the worker's model load, so batch.nightbatch.cost and `nightbatch doctor`
                        # show a batch that waited for its engine.
                        return await run_shard(job, engine=engine, blobs=services.adapters.blobs,
                                               table=services.adapters.table, settings=services.settings,
                                               model_load_seconds=time.monotonic() - waited, phases=phases)

                host.submit(run()).result()
                return
            except Exception:
                log.exception("shard %s of %s failed (attempt %d)", job.shard_id, job.batch_id, attempt)

    def _notify(self, services: Services, batch_id: str) -> None:
        if self.notifier is not None:
            notify_batch(batch_id, notifier=self.notifier)

    def warm_up_in_background(self) -> None:
        if self.host is not None:
            self.host.warm_up()

    def stop(self) -> None:
        self.stopping.set()
        self.pool.shutdown(wait=False, cancel_futures=True)
        if self.notifier is not None:
            self.notifier.close()
        if self.host is not None:
            self.host.stop()


def valid_or_open(services: Services, batch_id: str) -> bool:
    batch = services.adapters.table.get_record(BatchRecord, batch_id)
    return batch is not None and batch.status != "failed"
