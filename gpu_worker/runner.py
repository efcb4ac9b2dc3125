"""Run a shard: stream its lines through the engine, bounded in flight, checkpoint results, obey stops."""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import time
from collections import deque
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import BaseModel

from gpu_worker import host
from gpu_worker.checkpoints import Checkpointer, CheckpointPolicy
from gpu_worker.counters import AttemptCounters
from gpu_worker.engines.base import Engine
from gpu_worker.images import ImageError, LineImages
from gpu_worker.pace_watch import PaceJob, watch_pace
from gpu_worker.results import ResultLine, exception_reply, input_failure_line, is_fatal, result_line
from gpu_worker.scheduling import OrderPolicy, in_flight_limit, ordered
from gpu_worker.shard import PendingLines, Progress, load_shard, read_progress
from gpu_worker.watch import read_stop_reason, watch_batch
from nightbatch.aws import BlobStore, Table
from nightbatch.aws.records import BatchRecord
from nightbatch.batches.accounting import AttemptRecord, DoneMarker, write_attempt, write_done
from nightbatch.ids import new_request_id
from nightbatch.layout import done_key, results_prefix
from nightbatch.phases import Phases
from nightbatch.settings import Settings
from nightbatch.shards.spec import ShardSpec
from nightbatch.tenancy.scope import Scope
from nightbatch.validation.line import RequestLine

log = logging.getLogger("gpu_worker.runner")

GENERATE_ENDPOINTS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses"})
# Lines read from S3 per thread hop; the read-ahead is bounded by this plus max_in_flight.
READ_BLOCK = 256


class ShardJob(BaseModel):
    """What one worker container (or the local runner) is asked to run."""

    version: Literal[1] = 1
    batch_id: str
    shard_id: str


class ShardReport(BaseModel):
    """One attempt at a shard. inference + idle = the attempt's wall time after the model was loaded;
    inference is the time with at least one request in the engine."""

    batch_id: str
    shard_id: str
    attempt: str = ""
    lines: int = 0  # lines of the shard seen by this attempt: skipped + done
    done: int = 0  # results this attempt made durable
    skipped: int = 0  # finished by earlier attempts
    completed: int = 0
    failed: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    checkpoints: int = 0
    model_load_seconds: float = 0.0
    inference_seconds: float = 0.0
    idle_seconds: float = 0.0
    running_seconds: float = 0.0  # first request submitted -> last result in (bench/worker.py's running phase)
    finished: bool = False  # every line of the shard has a result and `_done.json` is written
    stopped_reason: str | None = None
    # Seconds from container start to weights ready, engine ready, first result, done; the weights' source.
    phases: dict[str, Any] = {}


def with_default_max_tokens(endpoint: str, body: dict[str, Any], default: int) -> dict[str, Any]:
    """Gives a generation request the configured output cap when it names none (vLLM's own default would be
    "the rest of the context", which lets one request hold a GPU for minutes)."""
    if endpoint not in GENERATE_ENDPOINTS or default <= 0:
        return body
    if endpoint == "/v1/responses":
        return body if body.get("max_output_tokens") is not None else {**body, "max_output_tokens": default}
    if body.get("max_tokens") is not None or body.get("max_completion_tokens") is not None:
        return body
    return {**body, "max_tokens": default}


async def preflight(job: ShardJob, *, blobs: BlobStore, table: Table) -> str | None:
    """Why this shard need not run (batch cancelled/expired/terminal, or shard already done), or None."""
    reason = await read_stop_reason(table, job.batch_id)
    if reason is not None:
        return reason
    done = done_key(job.batch_id, job.shard_id)
    # Listed, not HEADed: the worker may list only under batches/ (infra/stack.py), and S3 may then answer a
    # HEAD of a missing key with 403 rather than 404.
    if any(key == done for key in await asyncio.to_thread(lambda: list(blobs.list_keys(done)))):
        return "already_done"
    return None


async def run_shard(
    job: ShardJob, *, engine: Engine, blobs: BlobStore, table: Table, settings: Settings,
    stop: asyncio.Event | None = None, model_load_seconds: float = 0.0, phases: Phases | None = None,
    shard: ShardSpec | None = None, may_move: bool = False,
) -> ShardReport:
    """Runs what is left of a shard on a started engine. Returns when every line has a result (`finished`),
    or after a stop (batch cancelling/expired/terminal, or `stop` set) once in-flight requests are drained
    and flushed. Raises when the engine dies or a checkpoint cannot be written, after flushing what it can.

    `may_move`: an endpoint attempt whose shard has a GPU backend to move to; it stops (`endpoint_too_slow`) when
    the window's slack would run out at its pace (gpu_worker/pace_watch.py).

    `shard`: its definition, from a caller that already ran `preflight` and loaded it (the worker's entry
    does both before it starts the engine); without it, both happen here. Either way no request goes to the
    engine before the batch watcher's first read says the batch still wants results (it may have been
    cancelled while the engine started)."""
    report = ShardReport(batch_id=job.batch_id, shard_id=job.shard_id, model_load_seconds=model_load_seconds)
    if shard is None:
        reason = await preflight(job, blobs=blobs, table=table)
        if reason is not None:
            report.finished = reason == "already_done"
            report.stopped_reason = None if report.finished else reason
            log.info("shard %s/%s not run: %s", job.batch_id, job.shard_id, reason)
            return report
        shard = await asyncio.to_thread(load_shard, blobs, job.batch_id, job.shard_id)
    spec = shard
    prefix = results_prefix(job.batch_id, job.shard_id)
    progress = await asyncio.to_thread(read_progress, blobs, prefix)
    scope = Scope.of(settings, spec.tenant or await asyncio.to_thread(_batch_tenant, table, job.batch_id))
    run = _ShardRun(job, spec, engine, settings, progress, blobs=blobs, table=table, stop=stop,
                    phases=phases or Phases(), scope=scope, may_move=may_move)
    return await run.execute(report)


def _batch_tenant(table: Table, batch_id: str) -> str:
    """The batch's tenant, for a shard spec planned before specs named it. "" (no scope at all) when the batch
    is gone: the watcher then stops the shard before any request runs."""
    batch = table.get_record(BatchRecord, batch_id)
    return batch.tenant if batch is not None else ""


class _ShardRun:
    """The state of one attempt: in-flight tasks, the stop flag, and its counters."""

    def __init__(
        self, job: ShardJob, spec: ShardSpec, engine: Engine, settings: Settings, progress: Progress, *,
        blobs: BlobStore, table: Table, stop: asyncio.Event | None, phases: Phases, scope: Scope,
        may_move: bool = False,
    ) -> None:
        self.job, self.spec, self.engine, self.settings, self.progress = job, spec, engine, settings, progress
        self.scope = scope  # what this shard may read on its tenant's behalf (nightbatch/tenancy/scope.py)
        # Its lines' images, checked again and fetched within the bounds (gpu_worker/images.py); its byte budget is
        # this attempt's, shared by its lines in flight as `max_in_flight` is.
        self.images = LineImages(blobs, settings, scope)
        self.phases = phases
        self.blobs, self.table, self.stop = blobs, table, stop
        self.attempt = secrets.token_hex(4)
        self.prefix = results_prefix(job.batch_id, job.shard_id)
        self.checkpointer = Checkpointer(
            blobs=blobs, table=table, batch_id=job.batch_id, prefix=self.prefix, attempt=self.attempt,
            next_seq=progress.next_seq, policy=CheckpointPolicy.from_settings(settings.worker),
        )
        # A spec planned before specs named their tenant was validated before inputs carried it: not checked.
        self.pending = PendingLines(blobs, spec, progress.done, scope=scope if spec.tenant else None)
        self.max_in_flight = in_flight_limit(settings, engine)
        # An engine shared by several shards at once (the local stack) schedules by priority: each request's is
        # the count of this attempt's earlier ones, so a small batch's first requests go before a big one's
        # backlog (fair sharing by requests sent) instead of behind it.
        self.priorities = bool(getattr(engine, "priorities", False))
        self.sent = 0
        self.halt = asyncio.Event()
        self.watched = asyncio.Event()  # set once the batch watcher has read the batch
        self.reason: str | None = None
        self.fatal: BaseException | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self.counters = AttemptCounters()
        self.may_move = may_move

    async def execute(self, report: ShardReport) -> ShardReport:
        started = time.monotonic()
        log.info(
            "shard %s/%s attempt %s: %d lines, %d already done in %d checkpoints",
            self.job.batch_id, self.job.shard_id, self.attempt, self.spec.lines, len(self.progress.done),
            self.progress.checkpoints,
        )
        background = [asyncio.create_task(self._watch_batch()), asyncio.create_task(self._watch_stop())]
        if self.may_move:
            background.append(asyncio.create_task(watch_pace(
                PaceJob(self.job.batch_id, self.job.shard_id, self.attempt, self.spec.lines, len(self.progress.done)),
                results=lambda: self.counters.completed + self.counters.failed, halt=self._halt_for,
                stopped=self.halt, blobs=self.blobs, table=self.table, settings=self.settings)))
        flusher = self.checkpointer.start()
        flusher.add_done_callback(self._on_flusher_done)
        halt_waiter = asyncio.create_task(self.halt.wait())
        exhausted = False
        try:
            try:
                exhausted = await self._dispatch(halt_waiter)
            except Exception as exc:
                # A segment that cannot be read: finish what is in flight, flush, then fail the attempt.
                self.fatal = self.fatal or exc
                self._halt_for("error")
            await self._drain(halt_waiter)
        except asyncio.CancelledError:
            # The caller gave up on this attempt (e.g. the local stack shutting down): leave no task behind.
            for task in [*self.tasks, *background, halt_waiter, flusher]:
                task.cancel()
            raise
        for task in [*background, halt_waiter]:
            task.cancel()
        await asyncio.gather(*background, halt_waiter, return_exceptions=True)
        await self.checkpointer.close()
        finished = exhausted and self.counters.cancelled_requests == 0 and self.fatal is None
        elapsed = time.monotonic() - started
        self._fill(report, finished, elapsed)
        # Every attempt's GPU time counts toward the batch's cost, finished or not (Spot loss, cancel).
        await asyncio.to_thread(self._write_accounting, report)
        if finished:
            if report.lines != self.spec.lines:
                log.warning("shard %s/%s: definition says %d lines, segments hold %d", self.job.batch_id,
                            self.job.shard_id, self.spec.lines, report.lines)
            await asyncio.to_thread(self._write_done, report)
        log.info("shard %s/%s attempt %s: %s", self.job.batch_id, self.job.shard_id, self.attempt,
                 report.model_dump_json())
        if self.fatal is not None:
            raise self.fatal
        return report

    async def _dispatch(self, halt_waiter: asyncio.Task[Any]) -> bool:
        """Feeds lines to the engine until the shard is exhausted (True) or a stop arrives (False)."""
        lines: Iterator[RequestLine] = ordered(self.pending, OrderPolicy.from_settings(self.settings))
        watched = asyncio.create_task(self.watched.wait())
        await asyncio.wait({watched, halt_waiter}, return_when=asyncio.FIRST_COMPLETED)
        watched.cancel()
        block = max(1, min(READ_BLOCK, self.max_in_flight))
        ready: deque[RequestLine] = deque()
        exhausted = False
        while not self.halt.is_set():
            if len(self.tasks) >= self.max_in_flight:
                await asyncio.wait({*self.tasks, halt_waiter}, return_when=asyncio.FIRST_COMPLETED)
                continue
            if not ready:
                if exhausted:
                    return True
                got = await asyncio.to_thread(lambda: list(itertools.islice(lines, block)))
                exhausted = len(got) < block
                ready.extend(got)
                continue
            self._submit(ready.popleft())
        return exhausted and not ready

    async def _drain(self, halt_waiter: asyncio.Task[Any]) -> None:
        while self.tasks and not self.halt.is_set():
            await asyncio.wait({*self.tasks, halt_waiter}, return_when=asyncio.FIRST_COMPLETED)
        if not self.tasks:
            return
        _, late = await asyncio.wait(set(self.tasks), timeout=self.settings.worker.drain_seconds)
        for task in late:
            task.cancel()
        if late:
            log.warning("%d requests still running after %.0f s of draining; they will be rerun or reported "
                        "as not run", len(late), self.settings.worker.drain_seconds)
            await asyncio.wait(late)

    def _submit(self, request: RequestLine) -> None:
        if not self.tasks:
            self.counters.busy_from(time.monotonic())
        task = asyncio.create_task(self._run_one(request))
        self.tasks.add(task)
        task.add_done_callback(self._on_request_done)

    async def _run_one(self, request: RequestLine) -> None:
        if request.failure is not None:
            # Its input changed (or went) since Validate accepted it: that is its result, no engine involved.
            self._done(input_failure_line(self.job.batch_id, request.custom_id, request.failure, request.number))
            return
        request_id = new_request_id()
        endpoint = self.spec.endpoint
        body = with_default_max_tokens(endpoint, request.body, self.settings.serving.default_max_tokens)
        if self.priorities:
            body = {**body, "priority": self.sent}
        self.sent += 1
        try:
            async with self.images.resolved(endpoint, body) as ready:  # s3:// and file ids as data: URLs
                reply = await self.engine.handle(endpoint, ready, request_id)
        except ImageError as exc:
            reply = exc.reply()
        except Exception as exc:
            if is_fatal(exc):
                raise
            log.warning("request %s (line %d) raised %r; recorded as a 500", request.custom_id, request.number,
                        exc)
            reply = exception_reply(exc)
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            # Aborted by a stop (cancel, expiry, SIGTERM): vLLM may answer an aborted request with an error
            # body, which is not this request's result. It stays unrun: rerun on resume, or reported by
            # Finalize as `batch_cancelled` / `batch_expired`.
            raise asyncio.CancelledError
        self._done(result_line(self.job.batch_id, request.custom_id, request_id, reply, number=request.number))

    def _done(self, line: ResultLine) -> None:
        self.checkpointer.add(line)
        now = time.monotonic()
        self.counters.result(line, now)
        self.phases.mark("first_result", now)

    def _on_request_done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        if not self.tasks:
            self.counters.idle_at(time.monotonic())
        if task.cancelled():
            self.counters.cancelled_requests += 1
            return
        exc = task.exception()
        if exc is not None:
            log.error("engine failed: %r", exc)
            self.fatal = self.fatal or exc
            self._halt_for("engine_failed")

    def _on_flusher_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._halt_for("checkpoint_failed")

    def _halt_for(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
            log.info("shard %s/%s stopping: %s", self.job.batch_id, self.job.shard_id, reason)
            # An engine that holds requests back (the endpoint engine's admission) drops those it has not sent.
            stop_sending = getattr(self.engine, "stop_sending", None)
            if stop_sending is not None:
                stop_sending()
        self.halt.set()
        self.checkpointer.flush_soon()

    async def _watch_batch(self) -> None:
        reason = await watch_batch(
            self.table, self.job.batch_id, every=self.settings.worker.poll_seconds, halt=self.halt,
            polled=self.watched,
        )
        if reason:
            self._halt_for(reason)

    async def _watch_stop(self) -> None:
        if self.stop is not None:
            await self.stop.wait()
            self._halt_for("sigterm")

    def _fill(self, report: ShardReport, finished: bool, elapsed: float) -> None:
        report.attempt = self.attempt
        report.done = self.checkpointer.written
        report.skipped = self.pending.skipped
        report.lines = report.skipped + report.done
        report.checkpoints = self.checkpointer.objects
        c = self.counters
        report.completed, report.failed = c.completed, c.failed
        report.input_tokens, report.output_tokens = c.input_tokens, c.output_tokens
        report.inference_seconds = round(c.busy_seconds, 3)
        report.idle_seconds = round(max(0.0, elapsed - c.busy_seconds), 3)
        report.running_seconds = round(max(0.0, c.last_result - c.first_submit), 3)
        report.finished = finished
        report.stopped_reason = None if finished else (self.reason or "error")
        self.phases.mark("done")
        report.phases = self.phases.to_dict()

    def _write_accounting(self, report: ShardReport) -> None:
        where = host.detect()
        write_attempt(self.blobs, self.prefix, AttemptRecord(
            attempt=self.attempt, model_load_seconds=round(report.model_load_seconds, 3),
            inference_seconds=report.inference_seconds, idle_seconds=report.idle_seconds, finished=report.finished,
            phases=report.phases, backend=getattr(self.engine, "backend", None) or where.backend,
            instance_type=where.instance_type, training_job=where.training_job, lines=report.done,
            input_tokens=report.input_tokens, output_tokens=report.output_tokens,
        ))

    def _write_done(self, report: ShardReport) -> None:
        write_done(self.blobs, self.job.batch_id, self.job.shard_id, DoneMarker(
            lines=report.lines, model_load_seconds=round(report.model_load_seconds, 3),
            inference_seconds=report.inference_seconds, idle_seconds=report.idle_seconds,
            # Whole-shard totals: this attempt's plus those of the lines earlier attempts finished.
            input_tokens=self.progress.input_tokens + report.input_tokens,
            output_tokens=self.progress.output_tokens + report.output_tokens,
            attempts=len(self.progress.attempts | {self.attempt}),
        ))
