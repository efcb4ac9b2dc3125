"""Moving a batch along the lifecycle by hand, as the workflow would, for tests of what people see."""

from __future__ import annotations

from typing import Any

from nightbatch import lifecycle
from nightbatch.services import Services


def drive(services: Services, batch_id: str, *steps: str, **extra: Any) -> dict[str, Any]:
    """Moves a batch through `steps` (e.g. "in_progress", "finalizing", "completed"), skipping a step it is
    already in; `extra` fields are written with the last step. Returns the item."""
    table = services.adapters.table
    item = table.get(batch_id) or {}
    for i, step in enumerate(steps):
        last = i == len(steps) - 1
        if item.get("status") != step:
            item = lifecycle.transition(table, batch_id, step, extra=extra if last else None)
        elif last and extra:
            item = table.update(batch_id, set_=extra)
    return item
