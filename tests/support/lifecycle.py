"""Moving a batch along the lifecycle by hand, as the workflow would, for tests of what people see."""

from __future__ import annotations

from typing import Any

from nightbatch.aws.records import BatchRecord
from nightbatch.batches import lifecycle
from nightbatch.wiring import Services


def drive(services: Services, batch_id: str, *steps: str, **extra: Any) -> BatchRecord | None:
    """Moves a batch through `steps` (e.g. "in_progress", "finalizing", "completed"), skipping a step it is
    already in; `extra` fields are written with the last step. Returns the record."""
    table = services.adapters.table
    rec = table.get_record(BatchRecord, batch_id)
    for i, step in enumerate(steps):
        last = i == len(steps) - 1
        if rec is None or rec.status != step:
            rec = lifecycle.transition(table, batch_id, step, extra=extra if last else None)
        elif last and extra:
            rec = table.update_record(BatchRecord, batch_id, set_=extra)
    return rec
