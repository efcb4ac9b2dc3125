"""/v1/nightbatch/batches/{id}: results while the batch runs, and retrying some of its lines as a new batch."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response, StreamingResponse

from functions.api.deps import PrincipalDep, ServicesDep
from functions.api.idempotency import IdempotencyDep
from functions.api.routers.files import JSONL_MEDIA_TYPE, content_response
from nightbatch.results.partial import partial_results
from nightbatch.results.retry import RetryRequest, retry_batch
from nightbatch.wire import Batch

router = APIRouter(prefix="/v1/nightbatch/batches", tags=["nightbatch"])


@router.get("/{batch_id}/results", responses={200: {"content": {"application/jsonl": {}}}})
def batch_results(batch_id: str, principal: PrincipalDep, services: ServicesDep, kind: str = "output") -> Response:
    found = partial_results(services, principal.tenant, batch_id, kind)
    if found.file is not None:
        response = content_response(services, found.file)
        response.headers.update(found.headers())
        return response
    return StreamingResponse(found.lines, media_type=JSONL_MEDIA_TYPE, headers=found.headers())


@router.post("/{batch_id}/retry", response_model=Batch)
def retry(batch_id: str, principal: PrincipalDep, services: ServicesDep, idem: IdempotencyDep,
          body: RetryRequest | None = None) -> Any:
    return idem.run(lambda: retry_batch(services, principal.tenant, batch_id, body or RetryRequest()))
