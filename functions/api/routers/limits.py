"""/v1/nightbatch/limits: a tenant's own limits and what it uses of them now (0 in a limit = unlimited)."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter
from pydantic import BaseModel

from functions.api.deps import PrincipalDep, ServicesDep
from nightbatch.settings import TenantLimits
from nightbatch.tenancy.limits import TenantUsage, limits_for, read_usage

router = APIRouter(prefix="/v1/nightbatch", tags=["nightbatch"])


class LimitsView(BaseModel):
    object: Literal["nightbatch.limits"] = "nightbatch.limits"
    tenant: str
    limits: TenantLimits
    usage: TenantUsage


@router.get("/limits", response_model=LimitsView)
def get_limits(principal: PrincipalDep, services: ServicesDep) -> LimitsView:
    return LimitsView(
        tenant=principal.tenant,
        limits=limits_for(services.settings, principal.tenant),
        usage=read_usage(services.adapters.table, principal.tenant),
    )
