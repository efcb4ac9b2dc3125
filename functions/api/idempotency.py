"""The `Idempotency-Key` header for create routes: a dependency that fingerprints the request, and `run`.

Usage in a route (POST /v1/files, /v1/batches, /v1/uploads…):

    def create_x(..., idem: IdempotencyDep) -> Any:
        return idem.run(lambda: services.xs.create(...))

Without the header `run` just calls the function. With it, the first request claims the key and its answer
(success or a deterministic 4xx) is stored; the same key and request within the TTL gets that stored answer
(status and body, e.g. the same batch id; a failure is kept as its fields and rendered again in the envelope of
the path's wire: functions/api/errors.py); the same key with another request is a 409 that the SDK does not
retry; a duplicate while the first is still running is a 409 the SDK retries. 5xx, 429 and retryable 409s
free the key instead, so the SDK's own retry runs the request again.

The fingerprint never needs the body in memory: JSON bodies are small (the body-limit middleware caps them),
and multipart bodies are hashed from the parsed form, file parts in chunks from their spooled files. Multipart
boundaries are random per attempt, so the raw multipart bytes could not be compared anyway.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Header, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse
from starlette.datastructures import UploadFile

from functions.api.deps import PrincipalDep, ServicesDep
from functions.api.errors import stored_error_response
from nightbatch.errors import NightbatchError
from nightbatch.tenancy.idempotency import Fingerprint, IdempotencyStore, Replay, check_key

HASH_CHUNK = 1024 * 1024
FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")


@dataclass
class Idempotency:
    request: Request
    store: IdempotencyStore | None
    tenant: str
    key: str | None
    fingerprint: str

    def run(self, create: Callable[[], Any], *, status_code: int = 200) -> Any:
        if self.store is None or self.key is None:
            return create()
        outcome = self.store.begin(self.tenant, self.key, self.fingerprint)
        if isinstance(outcome, Replay):
            headers = {**outcome.headers, "idempotent-replayed": "true"}
            if outcome.status >= 400:
                return stored_error_response(self.request, outcome.status, outcome.body, headers)
            return JSONResponse(outcome.body, status_code=outcome.status, headers=headers)
        try:
            result = create()
        except NightbatchError as e:
            if _replayable(e):
                self.store.complete(outcome, e.status, e.envelope(), e.headers)
            else:
                self.store.abandon(outcome)
            raise
        except BaseException:
            self.store.abandon(outcome)
            raise
        body = jsonable_encoder(result)
        self.store.complete(outcome, status_code, body)
        return JSONResponse(body, status_code=status_code)


def _replayable(e: NightbatchError) -> bool:
    # A 4xx that the same request would get again; not a 429 or a conflict that may clear up.
    return 400 <= e.status < 500 and e.status != 429 and e.headers.get("x-should-retry") != "true"


async def fingerprint_request(request: Request) -> str:
    fp = Fingerprint(request.method, request.url.path)
    content_type = request.headers.get("content-type", "").lower()
    if content_type.startswith(FORM_TYPES):
        # Parsed once by FastAPI for the route's Form/File parameters; Starlette returns the same object.
        form = await request.form()
        for name, value in sorted(form.multi_items(), key=lambda kv: kv[0]):
            if isinstance(value, UploadFile):
                fp.update(b"file", name.encode(), (value.filename or "").encode())
                await _hash_upload(fp, value)
            else:
                fp.update(b"field", name.encode(), str(value).encode())
    else:
        fp.update(b"body", await request.body())
    return fp.hexdigest()


async def _hash_upload(fp: Fingerprint, upload: UploadFile) -> None:
    h = hashlib.sha256()
    await upload.seek(0)
    while chunk := await upload.read(HASH_CHUNK):
        h.update(chunk)
    await upload.seek(0)
    fp.update(h.digest())


async def get_idempotency(
    request: Request, principal: PrincipalDep, services: ServicesDep,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
) -> Idempotency:
    if idempotency_key is None:
        return Idempotency(request=request, store=None, tenant=principal.tenant, key=None, fingerprint="")
    check_key(idempotency_key)
    settings = services.settings
    store = IdempotencyStore(services.adapters.table, ttl_seconds=settings.api.idempotency_ttl_seconds,
                             lock_seconds=settings.api.idempotency_lock_seconds)
    return Idempotency(request=request, store=store, tenant=principal.tenant, key=idempotency_key,
                       fingerprint=await fingerprint_request(request))


IdempotencyDep = Annotated[Idempotency, Depends(get_idempotency)]
