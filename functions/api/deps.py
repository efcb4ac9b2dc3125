"""Request dependencies: the services, the authenticated tenant (stored or bootstrap keys), rate counting."""

from __future__ import annotations

import hmac
import threading
import weakref
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from nightbatch.errors import AuthenticationError
from nightbatch.keys import DEFAULT_TENANT, KeyCache, KeyStore
from nightbatch.limits import count_request
from nightbatch.services import Services
from nightbatch.storage import Table


@dataclass(frozen=True)
class Principal:
    tenant: str
    key_name: str


def get_services(request: Request) -> Services:
    services: Services = request.app.state.services()
    return services


ServicesDep = Annotated[Services, Depends(get_services)]

# One cache per table object (per process), so tests that build fresh tables never see another's keys.
_caches: weakref.WeakKeyDictionary[Table, KeyCache] = weakref.WeakKeyDictionary()
_caches_lock = threading.Lock()


def key_cache(services: Services) -> KeyCache:
    table = services.adapters.table
    with _caches_lock:
        cache = _caches.get(table)
        if cache is None or cache.ttl != services.settings.key_cache_seconds:
            cache = KeyCache(KeyStore(table), ttl=services.settings.key_cache_seconds)
            _caches[table] = cache
        return cache


def authenticate(request: Request, services: ServicesDep) -> Principal:
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise AuthenticationError(
            "You didn't provide an API key. You need to provide your API key in an Authorization header "
            "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
        )
    key = key.strip()
    principal = None
    for accepted in services.settings.accepted_keys:
        if hmac.compare_digest(accepted.encode(), key.encode()):
            principal = Principal(tenant=DEFAULT_TENANT, key_name="configured")
    if principal is None:
        rec = key_cache(services).lookup(key)
        if rec is not None:
            principal = Principal(tenant=rec.tenant, key_name=rec.name)
    if principal is None:
        raise AuthenticationError(
            "Incorrect API key provided. You can find your API key in your deployment's configuration or "
            "create one with `nightbatch keys create`."
        )
    request.state.tenant = principal.tenant
    # Counted after authentication, per tenant: one tenant's flood answers 429 to that tenant alone.
    count_request(services.adapters.table, principal.tenant, settings=services.settings)
    return principal


PrincipalDep = Annotated[Principal, Depends(authenticate)]
