"""/v1/uploads: create, add parts, complete, cancel (docs/ARCHITECTURE.md "The OpenAI wire contract", point 1)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, File, UploadFile

from functions.api.deps import Principal, PrincipalDep, ServicesDep
from functions.api.idempotency import IdempotencyDep
from nightbatch.files.uploads import CompleteUploadRequest, CreateUploadRequest
from nightbatch.wire import Upload, UploadPart
from nightbatch.wiring import Services

router = APIRouter(prefix="/v1/uploads", tags=["uploads"])


@router.post("", response_model=Upload)
def create_upload(
    body: CreateUploadRequest, principal: PrincipalDep, services: ServicesDep, idem: IdempotencyDep,
) -> Any:
    # Only create makes a new object; /complete is retry-safe on its own (same part_ids → same answer).
    return idem.run(lambda: _create_upload(body, principal, services))


def _create_upload(body: CreateUploadRequest, principal: Principal, services: Services) -> Upload:
    return services.uploads.create(principal.tenant, body)


@router.post("/{upload_id}/parts", response_model=UploadPart)
def add_upload_part(
    upload_id: str, principal: PrincipalDep, services: ServicesDep, data: Annotated[UploadFile, File()],
) -> UploadPart:
    data.file.seek(0, 2)
    size = data.file.tell()
    data.file.seek(0)
    return services.uploads.add_part(principal.tenant, upload_id, data.file, size)


@router.post("/{upload_id}/complete", response_model=Upload)
def complete_upload(
    upload_id: str, body: CompleteUploadRequest, principal: PrincipalDep, services: ServicesDep
) -> Upload:
    return services.uploads.complete(principal.tenant, upload_id, body)


@router.post("/{upload_id}/cancel", response_model=Upload)
def cancel_upload(upload_id: str, principal: PrincipalDep, services: ServicesDep) -> Upload:
    return services.uploads.cancel(principal.tenant, upload_id)
