"""Phase timings of a shard attempt: container start → weights ready → engine ready → first result → done.

The worker measures them (monotonic seconds since its container started) and writes them into the attempt's
accounting record (nightbatch.batches.accounting.AttemptRecord), its shard report and EMF metrics; Finalize
summarises every attempt of a batch into its `nightbatch.phases` extension, which `nightbatch status` shows.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any

PHASES = ("weights_ready", "engine_ready", "first_result", "done")
# EMF metric per phase (seconds since container start), with the weights' source as dimension.
PHASE_METRICS = {
    "weights_ready": "WeightsReadySeconds",
    "engine_ready": "EngineReadySeconds",
    "first_result": "FirstResultSeconds",
}
# Attempts listed one by one in a batch's extension; beyond this only the summary (the item stays small).
LISTED_ATTEMPTS = 20


@dataclass
class Phases:
    """One attempt's clock. `mark` keeps the first time a phase is reached."""

    started_at: float = field(default_factory=time.time)
    origin: float = field(default_factory=time.monotonic)
    seconds: dict[str, float] = field(default_factory=dict)
    weights_source: str = ""
    backend: str = ""  # "batch" or "sagemaker" (JobInputs.backend); empty where the job does not say

    def mark(self, phase: str, at: float | None = None) -> None:
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}")
        when = time.monotonic() if at is None else at
        self.seconds.setdefault(phase, round(max(0.0, when - self.origin), 3))

    def to_dict(self) -> dict[str, Any]:
        return {"container_start": round(self.started_at, 3), "weights_source": self.weights_source,
                **({"backend": self.backend} if self.backend else {}),
                **{f"{p}_s": self.seconds[p] for p in PHASES if p in self.seconds}}

    def metrics(self) -> dict[str, float]:
        return {PHASE_METRICS[p]: self.seconds[p] for p in PHASE_METRICS if p in self.seconds}


def summarize(attempts: list[dict[str, Any]]) -> dict[str, Any]:
    """A batch's phases: per phase the median and maximum over attempts, the weights' sources, a few attempts."""
    if not attempts:
        return {}
    ordered = sorted(attempts, key=lambda a: (str(a.get("shard_id", "")), float(a.get("container_start", 0))))
    summary: dict[str, Any] = {"attempts": len(attempts), "median_s": {}, "max_s": {}, "weights_sources": {}}
    for phase in PHASES:
        values = [float(a[f"{phase}_s"]) for a in attempts if isinstance(a.get(f"{phase}_s"), int | float)]
        if values:
            summary["median_s"][phase] = round(statistics.median(values), 3)
            summary["max_s"][phase] = round(max(values), 3)
    for a in attempts:
        source = str(a.get("weights_source") or "unknown")
        summary["weights_sources"][source] = summary["weights_sources"].get(source, 0) + 1
        if a.get("backend"):  # attempts per GPU backend (AWS Batch, SageMaker)
            backends = summary.setdefault("backends", {})
            backends[a["backend"]] = backends.get(a["backend"], 0) + 1
    summary["shards"] = ordered[:LISTED_ATTEMPTS]
    return summary


def describe(summary: dict[str, Any]) -> str | None:
    """One line for `nightbatch status`: median seconds from container start to each phase."""
    median = summary.get("median_s") if isinstance(summary, dict) else None
    if not isinstance(median, dict) or not median:
        return None
    names = {"weights_ready": "weights", "engine_ready": "engine", "first_result": "first result", "done": "done"}
    steps = " → ".join(f"{names[p]} {median[p]:.1f} s" for p in PHASES if p in median)
    sources = ", ".join(f"{k} x{v}" if v > 1 else k for k, v in sorted(summary.get("weights_sources", {}).items()))
    n = summary.get("attempts", 0)
    return f"{steps} (median of {n} attempt{'s' if n != 1 else ''}; weights from {sources})"
