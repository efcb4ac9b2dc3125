"""/v1/messages/batches: Anthropic's Message Batches API (create, retrieve, list, cancel, delete, results) over
the same batches; errors in Anthropic's envelope (functions/api/errors.py). docs/ANTHROPIC.md."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response, StreamingResponse

from functions.api.deps import PrincipalDep, ServicesDep
from functions.api.idempotency import IdempotencyDep
from functions.api.routers.files import redirect_response
from nightbatch.errors import InvalidRequestError
from nightbatch.files.downloads import Redirect
from nightbatch.messages import service
from nightbatch.messages.objects import CreateMessageBatch, DeletedMessageBatch, MessageBatch, MessageBatchPage


def require_version(request: Request) -> None:
    """Anthropic refuses a request without `anthropic-version` (its SDK always sends one); any version is served
    alike: these objects have not changed since 2023-06-01."""
    if not request.headers.get("anthropic-version"):
        raise InvalidRequestError("anthropic-version: header is required", param="anthropic-version")


router = APIRouter(prefix="/v1/messages/batches", tags=["messages"], dependencies=[Depends(require_version)])


@router.post("", response_model=MessageBatch)
def create_message_batch(body: CreateMessageBatch, principal: PrincipalDep, services: ServicesDep,
                         idem: IdempotencyDep) -> Any:
    return idem.run(lambda: service.create(services, principal.tenant, body))


@router.get("", response_model=MessageBatchPage)
def list_message_batches(
    principal: PrincipalDep, services: ServicesDep, limit: Annotated[int, Query()] = 20,
    before_id: str | None = None, after_id: str | None = None,
) -> MessageBatchPage:
    return service.list_page(services, principal.tenant, limit=limit, before_id=before_id, after_id=after_id)


@router.get("/{message_batch_id}", response_model=MessageBatch)
def retrieve_message_batch(message_batch_id: str, principal: PrincipalDep, services: ServicesDep) -> MessageBatch:
    return service.get(services, principal.tenant, message_batch_id)


@router.post("/{message_batch_id}/cancel", response_model=MessageBatch)
def cancel_message_batch(message_batch_id: str, principal: PrincipalDep, services: ServicesDep) -> MessageBatch:
    return service.cancel(services, principal.tenant, message_batch_id)


@router.delete("/{message_batch_id}", response_model=DeletedMessageBatch)
def delete_message_batch(message_batch_id: str, principal: PrincipalDep,
                         services: ServicesDep) -> DeletedMessageBatch:
    return service.delete(services, principal.tenant, message_batch_id)


@router.get("/{message_batch_id}/results", responses={200: {"content": {"application/binary": {}}}})
def message_batch_results(message_batch_id: str, principal: PrincipalDep, services: ServicesDep) -> Response:
    # Checked before the answer starts (service.results is not a generator): a refusal is a plain error. Past what
    # a Lambda response can carry: 307 to a pre-signed S3 URL, as for a File's content.
    served = service.results(services, principal.tenant, message_batch_id)
    if isinstance(served, Redirect):
        return redirect_response(served)
    return StreamingResponse(served, media_type="application/binary")
