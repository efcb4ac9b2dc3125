"""The sweeper: a batch whose workflow never started (StartExecution failed) is started again."""

from __future__ import annotations

from typing import Any

from nightbatch.clock import now
from nightbatch.services import Services

STALE_SECONDS = 300


def sweep(services: Services, *, stale_seconds: int = STALE_SECONDS) -> dict[str, Any]:
    table = services.adapters.table
    redriven: list[str] = []
    cutoff = now() - stale_seconds
    for key in table.query_open("validating"):
        batch = table.get(key["pk"])
        if batch is None or batch["status"] != "validating" or batch["created_at"] > cutoff:
            continue
        # Executions are named after the batch: starting one that exists is a no-op.
        services.batches.workflow.start(batch["pk"])
        redriven.append(batch["pk"])
    return {"redriven": redriven}
