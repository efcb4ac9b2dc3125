"""/v1/files: upload, list, retrieve, delete, content."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, File, Form, Query, Request, UploadFile
from fastapi.responses import RedirectResponse, Response, StreamingResponse

from functions.api.deps import Principal, PrincipalDep, ServicesDep
from functions.api.idempotency import IdempotencyDep
from nightbatch.aws.records import FileRecord
from nightbatch.files.downloads import Redirect
from nightbatch.files.downloads import locate as locate_download
from nightbatch.wire import DeletedFile, FileObject, ListPage
from nightbatch.wiring import Services

router = APIRouter(prefix="/v1/files", tags=["files"])

JSONL_MEDIA_TYPE = "application/jsonl; charset=utf-8"


@router.post("", response_model=FileObject)
def create_file(
    principal: PrincipalDep,
    services: ServicesDep,
    purpose: Annotated[str, Form()],
    file: Annotated[UploadFile, File()],
    idem: IdempotencyDep,
    expires_after_anchor: Annotated[str | None, Form(alias="expires_after[anchor]")] = None,
    expires_after_seconds: Annotated[int | None, Form(alias="expires_after[seconds]")] = None,
) -> Any:
    return idem.run(lambda: _create_file(
        principal, services, purpose, file, expires_after_anchor, expires_after_seconds))


def _create_file(
    principal: Principal, services: Services, purpose: str, file: UploadFile,
    expires_after_anchor: str | None, expires_after_seconds: int | None,
) -> FileObject:
    file.file.seek(0, 2)
    size = file.file.tell()
    file.file.seek(0)
    return services.files.upload(
        principal.tenant, filename=file.filename or "upload", purpose=purpose, fileobj=file.file, size=size,
        expires_after_seconds=expires_after_seconds, expires_after_anchor=expires_after_anchor,
    )


@router.get("", response_model=ListPage[FileObject])
def list_files(
    principal: PrincipalDep,
    services: ServicesDep,
    purpose: str | None = None,
    limit: Annotated[int, Query()] = 10_000,
    order: str = "desc",
    after: str | None = None,
) -> ListPage[FileObject]:
    return services.files.list(principal.tenant, purpose=purpose, limit=limit, order=order, after=after)


@router.get("/{file_id}", response_model=FileObject, responses={200: {"content": {"application/jsonl": {}}}})
def retrieve_file(file_id: str, request: Request, principal: PrincipalDep, services: ServicesDep) -> Any:
    item = services.files.item(principal.tenant, file_id)
    if (
        services.settings.files.seed_compat_file_get
        and item.purpose == "batch_output"
        and "application/json" not in request.headers.get("accept", "")
    ):
        # docs/ARCHITECTURE.md, decision 7: the `requests` quickstart downloads results from this URL.
        return content_response(services, item)
    return FileObject.model_validate(services.files.get(principal.tenant, file_id).model_dump())


@router.delete("/{file_id}", response_model=DeletedFile)
def delete_file(file_id: str, principal: PrincipalDep, services: ServicesDep) -> DeletedFile:
    return services.files.delete(principal.tenant, file_id)


@router.get("/{file_id}/content", responses={200: {"content": {"application/octet-stream": {}}}})
def file_content(file_id: str, principal: PrincipalDep, services: ServicesDep) -> Response:
    return content_response(services, services.files.item(principal.tenant, file_id))


def content_response(services: Services, item: FileRecord) -> Response:
    # Past what a Lambda response can carry: 307 to a pre-signed S3 URL (nightbatch.files.downloads).
    target = locate_download(services.settings, services.files.blobs, item)
    # The bytes are still the version accepted (a user's object may have changed or gone since): a 409 saying so
    # now, not a connection dropped mid-stream.
    services.files.check_readable(item)
    if target is not None:
        return redirect_response(target)
    media = JSONL_MEDIA_TYPE if item.filename.endswith(".jsonl") else "application/octet-stream"
    return StreamingResponse(
        services.files.chunks(item), media_type=media,
        headers={"content-length": str(item.bytes)},
    )


def redirect_response(target: Redirect) -> RedirectResponse:
    """A 307 to a short-lived pre-signed URL; the client drops its Authorization header on the way (downloads)."""
    return RedirectResponse(target.url, status_code=307, headers={"cache-control": "no-store"})
