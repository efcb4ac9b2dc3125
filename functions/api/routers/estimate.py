"""POST /v1/nightbatch/estimate: validate an input file and estimate a batch of it, without creating one."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from functions.api.deps import PrincipalDep, ServicesDep
from nightbatch.pipeline.estimate import EstimateRequest, estimate

router = APIRouter(prefix="/v1/nightbatch", tags=["nightbatch"])


@router.post("/estimate")
def create_estimate(req: EstimateRequest, principal: PrincipalDep, services: ServicesDep) -> dict[str, Any]:
    return estimate(services, principal.tenant, req)
