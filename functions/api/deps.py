"""Request dependencies: the services, the authenticated tenant (stored or bootstrap keys, sent as
`Authorization: Bearer` or Anthropic's `x-api-key`), rate counting."""

from __future__ import annotations

import hmac
import threading
import weakref
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from nightbatch.aws import Table
from nightbatch.errors import AuthenticationError
from nightbatch.tenancy.keys import DEFAULT_TENANT, STORED_KEY_RE, BootstrapKeys, KeyCache, KeyStore
from nightbatch.tenancy.limits import count_request
from nightbatch.wiring import Services


@dataclass(frozen=True)
class Principal:
    tenant: str
    key_name: str
    key_id: str = ""  # a stored key's public id (signed links name it); empty for the configured keys


def get_services(request: Request) -> Services:
    services: Services = request.app.state.services()
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


@dataclass
class AuthCaches:
    stored: KeyCache
    bootstrap: BootstrapKeys


# Per table object (so per process, and per test's fresh table): stored-key lookups and the bootstrap keys.
_caches: weakref.WeakKeyDictionary[Table, AuthCaches] = weakref.WeakKeyDictionary()
_caches_lock = threading.Lock()


def auth_caches(services: Services) -> AuthCaches:
    table = services.adapters.table
    settings = services.settings
    with _caches_lock:
        caches = _caches.get(table)
        if caches is None or caches.stored.ttl != settings.api.key_cache_seconds:
            read_secret = None
            if settings.api.api_keys_secret:
                secrets, secret_id = services.adapters.secrets, settings.api.api_keys_secret
                ttl = settings.api.key_cache_seconds

                def read_secret() -> str:
                    return secrets.read(secret_id, max_age=ttl)

            caches = AuthCaches(
                stored=KeyCache(KeyStore(table), ttl=settings.api.key_cache_seconds),
                bootstrap=BootstrapKeys(settings.api.accepted_keys, read_secret, ttl=settings.api.key_cache_seconds),
            )
            _caches[table] = caches
        return caches


def authenticate(request: Request, services: ServicesDep) -> Principal:
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        # The Anthropic SDK's header (accepted on every path, as Bearer is on the Anthropic wire's).
        scheme, key = "bearer", request.headers.get("x-api-key", "")
    if not key.strip():
        raise AuthenticationError(
            "You didn't provide an API key. You need to provide your API key in an Authorization header "
            "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
        )
    key = key.strip()
    caches = auth_caches(services)
    principal = None
    for accepted in caches.bootstrap.current():
        if hmac.compare_digest(accepted.encode(), key.encode()):
            principal = Principal(tenant=DEFAULT_TENANT, key_name="configured")
    if principal is None and STORED_KEY_RE.fullmatch(key):
        # Only a key shaped like one we issue costs a table read: junk is refused before any AWS call.
        rec = caches.stored.lookup(key)
        if rec is not None:
            principal = Principal(tenant=rec.tenant, key_name=rec.name, key_id=rec.key_id)
    if principal is None:
        raise AuthenticationError(
            "Incorrect API key provided. You can find your API key in your deployment's configuration or "
            "create one with `nightbatch keys create`."
        )
    # Counted after authentication, per tenant: one tenant's flood answers 429 to that tenant alone.
    count_request(services.adapters.table, principal.tenant, settings=services.settings)
    return principal


PrincipalDep = Annotated[Principal, Depends(authenticate)]
