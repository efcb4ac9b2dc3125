"""/v1/nightbatch/files/{id}/link and /download: short-lived signed links for browsers and emails."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from functions.api.deps import PrincipalDep, ServicesDep
from functions.api.routers.files import content_response
from nightbatch.files.links import FileLink, link_keys_from, open_link, sign_link

router = APIRouter(prefix="/v1/nightbatch/files", tags=["nightbatch"])

# The pre-signed S3 URL only has to live until the browser follows the redirect.
PRESIGN_SECONDS = 60


@router.post("/{file_id}/link", response_model=FileLink)
def create_file_link(
    file_id: str, request: Request, principal: PrincipalDep, services: ServicesDep
) -> FileLink:
    services.files.item(principal.tenant, file_id)  # 404 unless the caller's tenant owns a live file
    link = sign_link(services.settings, file_id, keys=link_keys_from(services.adapters),
                     api_key_id=principal.key_id)
    url = request.url_for("download_file", file_id=file_id).include_query_params(**link.query)
    return FileLink(url=str(url), expires_at=link.expires_at)


@router.get("/{file_id}/download", name="download_file",
            responses={307: {"description": "Redirect to a pre-signed S3 URL"}})
def download_file(file_id: str, services: ServicesDep, expires: str = "", sig: str = "", kid: str = "",
                  ak: str = "") -> Response:
    item = open_link(services.files, file_id, expires, sig, kid=kid, ak=ak, keys=link_keys_from(services.adapters))
    headers = {"cache-control": "no-store", "referrer-policy": "no-referrer"}
    if item.parts or item.source_objects:
        # A file composed of upload parts (or a user's objects) has no single S3 object to pre-sign: stream it.
        response = content_response(services, item)
        response.headers.update(headers)
        response.headers["content-disposition"] = f'attachment; filename="{_ascii(item.filename)}"'
        return response
    url = services.adapters.blobs.presign_get(
        item.s3_key, expires=PRESIGN_SECONDS, filename=item.filename
    )
    return RedirectResponse(url, status_code=307, headers=headers)


def _ascii(name: str) -> str:
    return "".join(ch if 32 <= ord(ch) < 127 and ch not in '"\\' else "_" for ch in name)
