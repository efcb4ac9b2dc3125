"""/v1/nightbatch/files/{id}/download: the signed links in batch emails (no API key; the signature is the key)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import RedirectResponse, Response

from functions.api.deps import ServicesDep
from functions.api.routers.files import content_response
from nightbatch.clock import now
from nightbatch.errors import NotFoundError
from nightbatch.notifications.links import verify_link

router = APIRouter(prefix="/v1/nightbatch/files", tags=["downloads"])

# Each click signs a new S3 URL that only has to live long enough for the redirect to be followed.
PRESIGN_SECONDS = 300


@router.get("/{file_id}/download", status_code=307, responses={307: {"description": "to a pre-signed S3 URL"}})
def download(
    file_id: str, services: ServicesDep, expires: Annotated[int, Query()], sig: Annotated[str, Query()]
) -> Response:
    verify_link(services.settings, file_id, expires, sig)
    item = services.adapters.table.get(file_id) if file_id.startswith("file-") else None
    expired = item is not None and item.get("expires_at") is not None and item["expires_at"] <= now()
    if item is None or item.get("kind") != "file" or expired:
        raise NotFoundError(f"No such File object: {file_id}", param="id")
    if item.get("parts"):
        return content_response(services, item)  # composed uploads have no single object to sign
    url = services.files.blobs.presign_get(item["s3_key"], expires=PRESIGN_SECONDS, filename=item["filename"])
    return RedirectResponse(url, status_code=307)
