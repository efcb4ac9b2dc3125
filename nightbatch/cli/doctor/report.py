"""What `nightbatch doctor` found: checks (key, models, the AWS account) and the phases of each probe batch."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Status = Literal["ok", "warn", "stalled", "failed", "skipped", "pending"]
PASSING = ("ok", "warn", "skipped")

# The phases of one probe batch, in the order they happen. The job phases need --stack (AWS Batch state).
PHASES = ("validate", "job queued", "job RUNNABLE", "job STARTING", "job RUNNING", "model loaded",
          "first result", "finalize", "notification")
JOB_PHASES = ("job queued", "job RUNNABLE", "job STARTING", "job RUNNING")


@dataclass
class Check:
    name: str
    status: Status
    detail: str = ""
    remedy: str = ""


@dataclass
class Phase:
    name: str
    status: Status = "pending"
    at: float | None = None  # seconds after the batch was created
    took: float | None = None  # seconds since the phase before it was reached (`Probe.settle`)
    detail: str = ""
    remedy: str = ""


@dataclass
class Probe:
    """One one-line batch: a model on one endpoint."""

    model: str
    endpoint: str
    batch_id: str | None = None
    created_at: float | None = None  # this machine's clock when the batch was created (epoch seconds)
    status: str | None = None  # the batch's last status
    phases: dict[str, Phase] = field(default_factory=lambda: {name: Phase(name) for name in PHASES})

    def phase(self, name: str) -> Phase:
        return self.phases[name]

    def reach(self, name: str, at: float, *, detail: str = "", status: Status = "ok") -> bool:
        """Marks a phase reached the first time; returns whether it was new."""
        p = self.phases[name]
        if p.status not in ("pending", "stalled"):
            return False
        p.status, p.at, p.detail, p.remedy = status, round(at, 2), detail, ""
        self.settle()
        return True

    def settle(self) -> None:
        """`took` = the time from the previous phase on the timeline (phases may be placed after the fact: model
        loaded comes from the worker's record when the batch ends)."""
        previous = 0.0
        for p in self.phases.values():
            if p.at is not None:
                p.took = round(max(0.0, p.at - previous), 2)
                previous = max(previous, p.at)

    def skip(self, name: str, detail: str) -> None:
        p = self.phases[name]
        if p.status == "pending":
            p.status, p.detail = "skipped", detail

    def fail(self, name: str, detail: str, remedy: str = "", *, status: Status = "failed") -> None:
        p = self.phases[name]
        if p.status in ("pending", "stalled"):
            p.status, p.detail, p.remedy = status, detail, remedy

    def current(self) -> Phase | None:
        """The first phase still pending (the one a stall is blamed on)."""
        return next((p for p in self.phases.values() if p.status in ("pending", "stalled")), None)

    @property
    def passed(self) -> bool:
        return all(p.status in PASSING for p in self.phases.values())


@dataclass
class Report:
    base_url: str
    stack: str | None = None
    checks: list[Check] = field(default_factory=list)
    probes: list[Probe] = field(default_factory=list)

    def add(self, check: Check) -> Check:
        self.checks.append(check)
        return check

    @property
    def passed(self) -> bool:
        return all(c.status in PASSING for c in self.checks) and all(p.passed for p in self.probes)

    def to_json(self) -> dict[str, Any]:
        return {
            "object": "nightbatch.doctor_report", "base_url": self.base_url, "stack": self.stack,
            "passed": self.passed, "checks": [asdict(c) for c in self.checks],
            "probes": [{"model": p.model, "endpoint": p.endpoint, "batch_id": p.batch_id, "status": p.status,
                        "passed": p.passed, "phases": [asdict(ph) for ph in p.phases.values()]}
                       for p in self.probes],
        }
