"""What one shard attempt counts: results by outcome, tokens, aborted requests, and the engine's busy time."""

from __future__ import annotations

from dataclasses import dataclass

from gpu_worker.results import ResultLine


@dataclass
class AttemptCounters:
    """What one attempt counts: results by outcome, tokens, aborted requests, and the busy time (monotonic
    seconds: a busy stretch runs from a submit to an empty engine)."""

    completed: int = 0
    failed: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cancelled_requests: int = 0
    busy_since: float = 0.0
    busy_seconds: float = 0.0
    first_submit: float = 0.0
    last_result: float = 0.0

    def busy_from(self, now: float) -> None:
        """The engine had nothing in flight and gets a request."""
        self.busy_since = now
        self.first_submit = self.first_submit or now

    def idle_at(self, now: float) -> None:
        """The engine's last in-flight request ended."""
        self.busy_seconds += now - self.busy_since

    def result(self, line: ResultLine, now: float) -> None:
        self.last_result = now
        if line.ok:
            self.completed += 1
        else:
            self.failed += 1
        self.input_tokens += line.input_tokens
        self.output_tokens += line.output_tokens
