"""The FastAPI application: routers, error rendering, middleware. Services are built lazily per process."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI

from functions.api import errors
from functions.api.middleware import BodyLimitMiddleware, RequestIdMiddleware, SchemaGateMiddleware
from functions.api.routers import (
    batch_results,
    batches,
    dashboard,
    dashboard_api,
    estimate,
    files,
    limits,
    links,
    message_batches,
    models,
    uploads,
    usage,
    webhooks,
)
from nightbatch import __version__
from nightbatch.wiring import Services, default_services


def create_app(services: Callable[[], Services] = default_services) -> FastAPI:
    app = FastAPI(title="nightbatch", version=__version__, description="OpenAI-compatible Batch API",
                  docs_url=None, redoc_url=None)
    app.state.services = services
    errors.install(app)
    for r in (files.router, batches.router, models.router, usage.router, limits.router, uploads.router,
              links.router, dashboard.router, dashboard_api.router, webhooks.router, estimate.router,
              batch_results.router, message_batches.router):
        app.include_router(r)
    app.add_middleware(BodyLimitMiddleware, upload_limit=lambda: services().settings.files.max_upload_bytes,
                       part_limit=lambda: services().settings.uploads.max_part_bytes)
    app.add_middleware(SchemaGateMiddleware, enabled=lambda: services().settings.deployment.mode == "local")
    app.add_middleware(RequestIdMiddleware)
    return app
