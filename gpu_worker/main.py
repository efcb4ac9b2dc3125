"""The worker container's entry: run one shard on a fresh engine, and exit with a code AWS Batch can act on.

Exit codes: 0 = the shard finished, or stopped because its batch is cancelling/expired/terminal (including
"never started": such a job ends without loading a model); 143 = stopped by SIGTERM/SIGINT while its batch
still wants results (the retry resumes from the checkpoints); 1 = an error worth a retry (engine died,
S3 unwritable, ...); 2 = bad command line; 3 = an endpoint attempt stopped so that its shard's remaining lines move to
the model's GPU backend (its pace would miss the window: gpu_worker/pace_watch.py; Capacity moves it).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from gpu_worker import host
from gpu_worker.engines.base import Engine
from gpu_worker.job_environment import apply_hf_token, apply_settings_document, report_failure
from gpu_worker.pace_watch import MOVE_REASON
from gpu_worker.runner import ShardJob, ShardReport, preflight, run_shard
from gpu_worker.shard import load_shard
from gpu_worker.watch import BATCH_REASONS, read_stop_reason
from nightbatch.aws import Adapters, make_adapters
from nightbatch.aws.records import BatchRecord
from nightbatch.batches.accounting import attempt_keys
from nightbatch.layout import results_prefix
from nightbatch.logs import configure_logging, log_context
from nightbatch.metrics import emit
from nightbatch.models.spec import ModelSpec
from nightbatch.phases import Phases
from nightbatch.settings import JobInputs, Settings, get_settings

log = logging.getLogger("gpu_worker")

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_MOVE = 3
EXIT_INTERRUPTED = 128 + signal.SIGTERM  # the shell's convention for "terminated by SIGTERM"


def main(argv: list[str] | None = None) -> int:
    phases = Phases()  # the container's start: its process's
    parser = argparse.ArgumentParser(prog="python -m gpu_worker", description="Run one shard of a batch.")
    parser.add_argument("--engine", default=None,
                        help="module:Class of an engine taking a ModelSpec (default: the vLLM engine; "
                             "env NIGHTBATCH_WORKER_ENGINE)")
    parser.add_argument("--batch-id", default=None, help="default: env NIGHTBATCH_BATCH_ID")
    parser.add_argument("--shard-id", default=None, help="default: env NIGHTBATCH_SHARD_ID")
    # SageMaker starts an image as `<image> train` unless the job names an entry point.
    parser.add_argument("mode", nargs="?", choices=("train",), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    inputs = JobInputs()  # this job's shard, beside the deployment's settings
    phases.backend = inputs.backend
    settings = get_settings()
    try:
        if apply_settings_document(inputs, settings):
            get_settings.cache_clear()
            settings = get_settings()
        apply_hf_token(settings)
    except Exception as exc:
        log.exception("the job's settings could not be read")
        report_failure(settings, f"settings: {type(exc).__name__}: {exc}")
        return EXIT_ERROR
    if settings.deployment.mode == "aws":
        configure_logging()  # JSON lines for CloudWatch Logs, each with the batch and shard ids
    else:
        logging.basicConfig(
            level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
    batch_id = args.batch_id or inputs.batch_id
    shard_id = args.shard_id or inputs.shard_id
    if not batch_id or not shard_id:
        parser.error("a batch id and a shard id are required (NIGHTBATCH_BATCH_ID / NIGHTBATCH_SHARD_ID)")
    job = ShardJob(batch_id=batch_id, shard_id=shard_id)
    adapters = make_adapters(settings)
    engine_path = args.engine or settings.worker.engine
    try:
        with log_context(batch_id=batch_id, shard_id=shard_id):
            code = asyncio.run(serve_shard(job, settings, adapters, engine_path=engine_path, phases=phases))
    except Exception as exc:
        log.exception("shard %s/%s failed", batch_id, shard_id)
        report_failure(settings, f"{type(exc).__name__}: {exc}")
        return EXIT_ERROR
    if code == EXIT_INTERRUPTED:
        report_failure(settings, "stopped by SIGTERM with lines left; a new attempt resumes from the checkpoints")
    return code


async def serve_shard(
    job: ShardJob, settings: Settings, adapters: Adapters, *, engine_path: str, phases: Phases | None = None
) -> int:
    phases = phases or Phases()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    blobs, table = adapters.blobs, adapters.table
    # Once per attempt, before the engine starts: run_shard is handed the shard and does neither again.
    reason = await preflight(job, blobs=blobs, table=table)
    if reason is not None:
        # The cheap end of an unstarted job of a cancelled/expired batch, or a retry of a finished shard.
        log.info("shard %s/%s: nothing to do (%s); engine not started", job.batch_id, job.shard_id, reason)
        return EXIT_OK
    shard = await asyncio.to_thread(load_shard, blobs, job.batch_id, job.shard_id)
    spec = settings.serving.model(shard.model)
    if spec is None:
        raise LookupError(f"model {shard.model!r} of shard {job.shard_id} is not in the model registry")
    started = time.monotonic()
    on_endpoint = host.detect().backend == "endpoint"
    engine = await build_engine(spec, engine_path, adapters, phases, on_endpoint=on_endpoint,
                                deadline=await _deadline(adapters, job.batch_id) if on_endpoint else None)
    try:
        await engine.start()
        phases.mark("engine_ready")
        load_seconds = time.monotonic() - started
        report = await run_shard(
            job, engine=engine, blobs=blobs, table=table, settings=settings, stop=stop,
            model_load_seconds=load_seconds, phases=phases, shard=shard,
            # An endpoint shard moves to the model's GPU backend when the endpoint is too slow for its window.
            may_move=on_endpoint and spec.has_weights,
        )
    finally:
        await engine.stop()
    print(report.model_dump_json(), flush=True)
    attempts = len(await asyncio.to_thread(attempt_keys, blobs, results_prefix(job.batch_id, job.shard_id)))
    emit(settings, {
        "RequestsCompleted": report.completed, "RequestsFailed": report.failed,
        "PromptTokens": report.input_tokens, "CompletionTokens": report.output_tokens,
        "ShardDurationSeconds": round(time.monotonic() - started, 3), "ShardAttempt": max(1, attempts),
    }, units={"ShardDurationSeconds": "Seconds"})
    emit(settings, phases.metrics(), units=dict.fromkeys(phases.metrics(), "Seconds"),
         dimensions={"WeightsSource": phases.weights_source or "unknown"})
    return await exit_code(report, job, adapters)


async def build_engine(spec: ModelSpec, engine_path: str, adapters: Adapters, phases: Phases | None = None, *,
                       on_endpoint: bool = False, deadline: float | None = None) -> Engine:
    """The engine of this attempt: `engine_path`'s (tests, benches), the model's endpoint when the job runs there
    (`NIGHTBATCH_BACKEND=endpoint`: the endpoint runner's job), else vLLM on this host's GPUs."""
    phases = phases or Phases()
    if on_endpoint and not engine_path:
        from gpu_worker.engines.endpoint_engine import endpoint_engine

        if spec.endpoint is None:
            raise LookupError(f"model {spec.name!r} has no endpoint, but this job runs on the endpoint backend")
        phases.weights_source = "endpoint"  # nothing to load: the server has the model
        phases.mark("weights_ready")
        endpoint: Engine = endpoint_engine(spec, adapters.settings, deadline=deadline,
                                           secrets_client=lambda: adapters.client("secretsmanager"))
        return endpoint
    if engine_path:
        factory: Callable[[ModelSpec], Any] = load_engine_class(engine_path)
        engine: Engine = factory(spec)
        phases.weights_source = "engine"  # an engine of its own (tests, benches) loads nothing here
        phases.mark("weights_ready")
        return engine
    # Imported here: vLLM is heavy and only the engine module may import it.
    from gpu_worker.engines.vllm_engine import VllmEngine  # type: ignore[import-not-found,unused-ignore]
    from gpu_worker.weight_cache import resolve_adapters, resolve_weights

    settings = adapters.settings
    # In AWS the stack's bucket caches Hugging Face weights (models/<name>@<revision>/); locally nothing does.
    bucket = settings.deployment.bucket if settings.deployment.mode == "aws" else ""
    weights = await asyncio.to_thread(resolve_weights, spec, bucket=bucket, s3=adapters.client("s3"))
    phases.weights_source = weights.source
    phases.mark("weights_ready")
    log.info("weights of %s from %s (%s)", spec.name, weights.source, weights.path)
    lora_dirs = await asyncio.to_thread(resolve_adapters, spec, s3=adapters.client("s3"))
    vllm_engine: Engine = VllmEngine(spec, model_dir=weights.path, load_format=weights.load_format,
                                     lora_dirs=lora_dirs, media_domains=settings.validation.media_allowed_domains)
    return vllm_engine


async def _deadline(adapters: Adapters, batch_id: str) -> float | None:
    """The batch's expires_at, which the endpoint engine tells the server in every request."""
    batch = await asyncio.to_thread(adapters.table.get_record, BatchRecord, batch_id)
    return float(batch.expires_at) if batch is not None and batch.expires_at is not None else None


def load_engine_class(path: str) -> Callable[[ModelSpec], Any]:
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"engine must be given as module:Class, not {path!r}")
    factory: Callable[[ModelSpec], Any] = getattr(importlib.import_module(module_name), attr)
    return factory


async def exit_code(report: ShardReport, job: ShardJob, adapters: Adapters) -> int:
    if report.finished or report.stopped_reason in BATCH_REASONS:
        return EXIT_OK
    if report.stopped_reason == MOVE_REASON:
        return EXIT_MOVE
    # Stopped by a signal: a clean end only if the batch no longer wants this shard (e.g. the job was
    # terminated because the batch was cancelled); otherwise lines remain and a retry must resume them.
    if await read_stop_reason(adapters.table, job.batch_id) is not None:
        return EXIT_OK
    return EXIT_INTERRUPTED
