"""Runs the doctor: the checks, then every probe batch at once, polled until each ends or stalls for good."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Protocol, TextIO

import openai

from nightbatch.cli.doctor import api
from nightbatch.cli.doctor.report import JOB_PHASES, Check, Phase, Probe, Report
from nightbatch.wire import TERMINAL_STATUSES


class Watcher(Protocol):
    """A source of phases beyond the batch object: the AWS account (--stack) or a local webhook receiver."""

    def preflight(self, report: Report) -> None: ...

    def observe(self, probe: Probe, at: float) -> None: ...

    def diagnose(self, probe: Probe, phase: Phase) -> tuple[str, str] | None: ...

    def close(self) -> None: ...


def stall_remedy(phase: str) -> str:
    """What to look at when a phase stalls and nothing more specific is known."""
    if phase == "validate":
        return ("the workflow has not run Validate: with --stack the doctor reads the execution; otherwise look at "
                "the state machine's executions (execution name = batch id) and the API Lambda's log")
    if phase in ("model loaded", "first result", *JOB_PHASES):
        return ("no result yet: the GPU job has not run or is still loading the model. Pass --stack NAME to see "
                "the AWS Batch job (GPU quota, Spot role, image pull, Hugging Face token); `nightbatch local "
                "--no-engines` never runs batches")
    if phase == "finalize":
        return "Finalize has not finished: look at the Finalize Lambda's log and the execution's history"
    return "look at the Notify Lambda's log and the webhook deliveries (/v1/nightbatch/webhook_endpoints/ID/deliveries)"


class Doctor:
    def __init__(self, client: openai.OpenAI, report: Report, watchers: list[Watcher], *, timeout: float,
                 stall_after: float, poll: float, progress: TextIO | None = sys.stderr,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.report = report
        self.watchers = watchers
        self.timeout = timeout
        self.stall_after = stall_after
        self.poll = poll
        self.progress = progress
        self.clock = clock

    def say(self, text: str) -> None:
        if self.progress is not None:
            print(text, file=self.progress, flush=True)

    def run(self) -> Report:
        report = self.report
        key = report.add(api.check_key(self.client))
        if key.status == "failed":
            return report
        models, served = api.served_models(self.client)
        report.add(models)
        for watcher in self.watchers:
            watcher.preflight(report)
        pairs = api.probe_pairs(served)
        started: dict[int, float] = {}
        certain: dict[int, bool] = {}
        for model, endpoint, sure in pairs:
            probe = Probe(model=model, endpoint=endpoint)
            started[id(probe)] = self.clock()
            try:
                api.create_probe(self.client, probe)
            except openai.APIStatusError as e:
                report.add(Check(f"create {model} {endpoint}", "failed", f"{e.message} (HTTP {e.status_code})"))
                continue
            certain[id(probe)] = sure
            report.probes.append(probe)
            self.say(f"  {model} {endpoint}: batch {probe.batch_id}")
        self._follow(started)
        # A server that does not list its models' endpoints had every endpoint tried: drop the refusals.
        report.probes = [p for p in report.probes if certain[id(p)] or "model_not_found" not in
                         p.phase("validate").detail]
        return report

    def _done(self, probe: Probe) -> bool:
        return probe.status in TERMINAL_STATUSES and probe.phase("notification").status != "pending"

    def _follow(self, started: dict[int, float]) -> None:
        changed = {id(p): self.clock() for p in self.report.probes}
        deadline = self.clock() + self.timeout
        while True:
            waiting = [p for p in self.report.probes if not self._done(p)]
            if not waiting:
                return
            if self.clock() >= deadline:
                break
            for probe in waiting:
                self._poll(probe, self.clock() - started[id(probe)], changed)
            if any(not self._done(p) for p in self.report.probes):
                time.sleep(self.poll)
        for probe in self.report.probes:  # out of time: blame the phase each one is stuck in
            phase = probe.current()
            if phase is not None:
                self._stall(probe, phase, final=True, idle=self.timeout)

    def _poll(self, probe: Probe, at: float, changed: dict[int, float]) -> None:
        assert probe.batch_id
        before = [(p.status, p.at) for p in probe.phases.values()]
        if probe.status not in TERMINAL_STATUSES:
            api.observe(self.client, probe, self.client.batches.retrieve(probe.batch_id), at)
        for watcher in self.watchers:
            watcher.observe(probe, at)
        after = [(p.status, p.at) for p in probe.phases.values()]
        if after != before:
            changed[id(probe)] = self.clock()
            for (status, _), phase in zip(before, probe.phases.values(), strict=True):
                if phase.status != status and phase.status != "skipped":
                    when = f" at {phase.at:.1f}s" if phase.at is not None else ""
                    self.say(f"  {probe.model} {probe.endpoint}: {phase.name} {phase.status}{when}")
            return
        stuck = probe.current()
        if stuck is not None and stuck.status == "pending" and self.clock() - changed[id(probe)] > self.stall_after:
            self._stall(probe, stuck, final=False, idle=self.clock() - changed[id(probe)])

    def _stall(self, probe: Probe, phase: Phase, *, final: bool, idle: float) -> None:
        found = next((d for w in self.watchers if (d := w.diagnose(probe, phase)) is not None), None)
        detail, remedy = found or (f"no progress for {idle:.0f} s", stall_remedy(phase.name))
        was = phase.status
        phase.status, phase.detail, phase.remedy = "stalled", detail, remedy
        if final:
            phase.detail = f"{detail} (gave up after {self.timeout:g} s)"
        elif was != "stalled":
            self.say(f"  {probe.model} {probe.endpoint}: {phase.name} stalled: {detail}\n    → {remedy}")
