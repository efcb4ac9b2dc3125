"""/v1/batches: create, retrieve, list (newest first), cancel."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from functions.api.deps import PrincipalDep, ServicesDep
from functions.api.idempotency import IdempotencyDep
from nightbatch.batches.request import CreateBatchRequest
from nightbatch.wire import Batch, ListPage

router = APIRouter(prefix="/v1/batches", tags=["batches"])


@router.post("", response_model=Batch)
def create_batch(body: CreateBatchRequest, principal: PrincipalDep, services: ServicesDep,
                 idem: IdempotencyDep) -> Any:
    return idem.run(lambda: services.batches.create(principal.tenant, body))


@router.get("", response_model=ListPage[Batch])
def list_batches(
    principal: PrincipalDep, services: ServicesDep,
    limit: Annotated[int, Query()] = 20, after: str | None = None,
) -> ListPage[Batch]:
    return services.batches.list(principal.tenant, limit=limit, after=after)


@router.get("/{batch_id}", response_model=Batch)
def retrieve_batch(batch_id: str, principal: PrincipalDep, services: ServicesDep) -> Batch:
    return services.batches.get(principal.tenant, batch_id)


@router.post("/{batch_id}/cancel", response_model=Batch)
def cancel_batch(batch_id: str, principal: PrincipalDep, services: ServicesDep) -> Batch:
    return services.batches.cancel(principal.tenant, batch_id)
