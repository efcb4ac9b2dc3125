"""One engine, many shards, each started on an empty prefix cache: what a fleet of GPUs does, one shard
after another on one machine (bench/sharding.py drives it).

    python -m bench.shard_host          # env as `python -m gpu_worker` (NIGHTBATCH_*, AWS_*); stdin: commands

Reads one JSON command a line on stdin, `{"batch_id": ..., "shard_id": ...}`; for each it resets the
engine's prefix cache, runs the shard with the worker's own `run_shard` (the same runner `python -m
gpu_worker` uses) and prints the ShardReport as one JSON line on stdout. Starting the engine once saves the
minute a fresh process costs on a small CPU box; the reset makes each shard start as cold as on its own GPU
(vLLM's `reset_prefix_cache`; the bench refuses to go on if the engine does not confirm it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from typing import Any

log = logging.getLogger("bench.shard_host")


async def reset_prefix_cache(engine: Any) -> bool:
    """Empties vLLM's prefix cache (no request is running between shards). False when the engine has none
    to reset (a test engine) or vLLM declined."""
    client = getattr(getattr(engine, "_state", None), "engine_client", None)
    if client is None:
        return False
    return bool(await client.reset_prefix_cache())


async def serve(lines: Any, out: Any) -> None:
    from gpu_worker.main import build_engine
    from gpu_worker.runner import ShardJob, run_shard
    from gpu_worker.shard import load_shard
    from nightbatch.aws import make_adapters
    from nightbatch.settings import get_settings

    settings = get_settings()
    adapters = make_adapters(settings)
    engine = None
    try:
        for raw in lines:
            if not raw.strip():
                continue
            job = ShardJob(**json.loads(raw))
            if engine is None:
                shard = await asyncio.to_thread(load_shard, adapters.blobs, job.batch_id, job.shard_id)
                spec = settings.serving.model(shard.model)
                if spec is None:
                    raise LookupError(f"model {shard.model!r} is not in the model registry")
                engine = await build_engine(spec, settings.worker.engine, adapters)
                await engine.start()
            reset = await reset_prefix_cache(engine)
            report = await run_shard(job, engine=engine, blobs=adapters.blobs, table=adapters.table,
                                     settings=settings)
            out.write(json.dumps({**report.model_dump(), "prefix_cache_reset": reset}) + "\n")
            out.flush()
    finally:
        if engine is not None:
            await engine.stop()


def main() -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(serve(sys.stdin, sys.stdout))


if __name__ == "__main__":
    main()
