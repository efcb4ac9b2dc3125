"""Warm engines for the local stack: one per model, on one asyncio loop in a background thread; a model with an
`endpoint` runs on its server instead (gpu_worker/engines/endpoint_engine.py), with nothing to warm up."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

from nightbatch.models.spec import ModelSpec
from nightbatch.settings import Settings

log = logging.getLogger("nightbatch.local")
T = TypeVar("T")


class EngineHost:
    """Owns the event loop that every engine call and every local shard run on."""

    def __init__(self, settings: Settings, *, secrets_client: Callable[[], Any] | None = None) -> None:
        self.settings = settings
        self.secrets_client = secrets_client or (lambda: None)  # an endpoint's key may be a secret's
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="engines", daemon=True)
        self.thread.start()
        self.engines: dict[str, Any] = {}
        self.locks: dict[str, asyncio.Lock] = {}

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    async def engine(self, name: str) -> Any:
        """The warm engine for a model, started on first use (`vllm` is imported only then)."""
        lock = self.locks.setdefault(name, asyncio.Lock())
        async with lock:
            if name not in self.engines:
                spec = self.settings.serving.model(name)
                if spec is None:
                    raise LookupError(f"model {name!r} is not configured")
                self.engines[name] = await self._start(spec)
            return self.engines[name]

    @contextlib.asynccontextmanager
    async def shard_engine(self, model: str, *, deadline: float | None) -> AsyncIterator[Any]:
        """The engine one shard of `model` runs on: the model's endpoint (an engine of the shard's own, which
        tells the server the batch's deadline; the endpoint's admission is shared), else the warm engine."""
        spec = self.settings.serving.model(model)
        if spec is None or spec.endpoint is None:
            yield await self.engine(model)
            return
        from gpu_worker.engines.endpoint_engine import endpoint_engine

        engine = endpoint_engine(spec, self.settings, secrets_client=self.secrets_client, deadline=deadline)
        await engine.start()
        try:
            yield engine
        finally:
            await engine.stop()

    async def _start(self, spec: ModelSpec) -> Any:
        from gpu_worker.engines.vllm_engine import VllmEngine
        from gpu_worker.model_prep import resolve_model_dir

        t0 = time.monotonic()
        print(f"nightbatch local: preparing model {spec.name} …", file=sys.stderr, flush=True)
        model_dir = await asyncio.to_thread(resolve_model_dir, spec)
        print(f"nightbatch local: starting engine for {spec.name} (about 30 s on a CPU) …", file=sys.stderr,
              flush=True)
        # Shards of several open batches share this engine: it schedules by the priority each request carries
        # (gpu_worker.runner), unless the model's own engine_args chose another policy.
        policy = spec.engine_args.get("scheduling_policy", "priority")
        if policy == "priority":
            spec = spec.model_copy(update={"engine_args": {**spec.engine_args, "scheduling_policy": "priority"}})
        engine = VllmEngine(spec, model_dir=model_dir, media_domains=self.settings.validation.media_allowed_domains)
        await engine.start()
        engine.priorities = policy == "priority"  # type: ignore[attr-defined]
        print(f"nightbatch local: engine {spec.name} ready in {time.monotonic() - t0:.0f} s", file=sys.stderr,
              flush=True)
        return engine

    def warm_up(self) -> Future[None]:
        async def all_engines() -> None:
            for spec in self.settings.serving.models:
                if spec.endpoint is not None:  # served elsewhere
                    continue
                try:
                    await self.engine(spec.name)
                except Exception:
                    log.exception("engine %s failed to start", spec.name)

        return self.submit(all_engines())

    def stop(self) -> None:
        async def stop_all() -> None:
            for engine in self.engines.values():
                try:
                    await engine.stop()
                except Exception:
                    log.exception("engine stop failed")

        if self.engines:
            try:
                self.submit(stop_all()).result(timeout=30)
            except Exception:
                log.exception("engines did not stop cleanly")
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        if not self.thread.is_alive():
            self.loop.close()
