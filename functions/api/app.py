"""The FastAPI application: routers, error rendering, middleware. Services are built lazily per process."""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from fastapi import FastAPI

from functions.api import errors
from functions.api.middleware import BodyLimitMiddleware, RequestIdMiddleware
from functions.api.routers import batches, downloads, files, models, webhooks
from nightbatch.services import Services, build_services
from nightbatch.settings import get_settings
from nightbatch.storage import make_adapters


@lru_cache(maxsize=1)
def default_services() -> Services:
    return build_services(make_adapters(get_settings()))


def create_app(services: Callable[[], Services] = default_services) -> FastAPI:
    app = FastAPI(title="nightbatch", version="0.1.0", description="OpenAI-compatible Batch API")
    app.state.services = services
    errors.install(app)
    for r in (files.router, batches.router, models.router, webhooks.router, downloads.router):
        app.include_router(r)
    app.add_middleware(BodyLimitMiddleware, upload_limit=lambda: services().settings.max_upload_bytes)
    app.add_middleware(RequestIdMiddleware)
    return app
