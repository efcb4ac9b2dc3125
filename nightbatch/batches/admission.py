"""Creating a batch within the tenant's in-flight limit: a slot for the new id, given back on failure."""

from __future__ import annotations

from typing import Any

from nightbatch.batches.request import CreateBatchRequest
from nightbatch.ids import new_batch_id
from nightbatch.services import Services
from nightbatch.tenancy.limits import admit_batch, release_batch_slot
from nightbatch.wire import Batch


def create_admitted(services: Services, tenant: str, req: CreateBatchRequest, *,
                    ext: dict[str, Any] | None = None, wire: str = "openai", total: int = 0) -> Batch:
    batch_id = new_batch_id()
    table = services.adapters.table
    admit_batch(table, tenant, batch_id, settings=services.settings)
    try:
        return services.batches.create(tenant, req, batch_id=batch_id, ext=ext, wire=wire, total=total)
    except BaseException:
        release_batch_slot(table, tenant, batch_id)
        raise
