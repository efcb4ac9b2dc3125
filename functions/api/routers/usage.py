"""/v1/nightbatch/usage: a tenant's tokens, GPU-seconds and estimated cost over a period."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from functions.api.deps import PrincipalDep, ServicesDep
from nightbatch.tenancy.usage import tenant_usage

router = APIRouter(prefix="/v1/nightbatch", tags=["nightbatch"])


@router.get("/usage")
def usage(principal: PrincipalDep, services: ServicesDep, start: int | None = None,
          end: int | None = None) -> dict[str, Any]:
    return tenant_usage(services.adapters.table, principal.tenant, start=start, end=end)
