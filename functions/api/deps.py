"""Request dependencies: the services, the authenticated tenant."""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from nightbatch.errors import AuthenticationError
from nightbatch.services import Services


@dataclass(frozen=True)
class Principal:
    tenant: str
    key_name: str


def get_services(request: Request) -> Services:
    services: Services = request.app.state.services()
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


def authenticate(request: Request, services: ServicesDep) -> Principal:
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise AuthenticationError(
            "You didn't provide an API key. You need to provide your API key in an Authorization header "
            "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
        )
    key = key.strip()
    for accepted in services.settings.accepted_keys:
        if hmac.compare_digest(accepted.encode(), key.encode()):
            return Principal(tenant="default", key_name="configured")
    raise AuthenticationError("Incorrect API key provided. You can find your API key in your deployment's "
                              "configuration or create one with `nightbatch keys create`.")


PrincipalDep = Annotated[Principal, Depends(authenticate)]
