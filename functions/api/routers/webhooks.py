"""/v1/webhook_endpoints (OpenAI SDK 3.x `client.webhooks`), /v1/webhook_event_types, and delivery records."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from functions.api.deps import PrincipalDep, ServicesDep
from nightbatch.notifications import Notifier
from nightbatch.notifications.objects import (
    BATCH_EVENT_TYPES,
    CreateWebhookEndpointRequest,
    DeletedWebhookEndpoint,
    RotateSecretRequest,
    TestWebhookRequest,
    UpdateWebhookEndpointRequest,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEndpointTestResult,
    WebhookEndpointWithSecret,
    WebhookEventTypeList,
)
from nightbatch.wire import ListPage

router = APIRouter(prefix="/v1", tags=["webhooks"])


def get_notifier(services: ServicesDep) -> Notifier:
    return services.notifier


NotifierDep = Annotated[Notifier, Depends(get_notifier)]


@router.post("/webhook_endpoints", response_model=WebhookEndpointWithSecret)
def create_endpoint(
    body: CreateWebhookEndpointRequest, principal: PrincipalDep, notifier: NotifierDep
) -> WebhookEndpointWithSecret:
    return notifier.endpoints.create(principal.tenant, body)


@router.get("/webhook_endpoints", response_model=ListPage[WebhookEndpoint])
def list_endpoints(
    principal: PrincipalDep, notifier: NotifierDep, limit: Annotated[int, Query()] = 20, after: str | None = None
) -> ListPage[WebhookEndpoint]:
    return notifier.endpoints.list(principal.tenant, limit=limit, after=after)


@router.get("/webhook_endpoints/{endpoint_id}", response_model=WebhookEndpoint)
def retrieve_endpoint(endpoint_id: str, principal: PrincipalDep, notifier: NotifierDep) -> WebhookEndpoint:
    return notifier.endpoints.get(principal.tenant, endpoint_id)


@router.post("/webhook_endpoints/{endpoint_id}", response_model=WebhookEndpoint)
def update_endpoint(
    endpoint_id: str, body: UpdateWebhookEndpointRequest, principal: PrincipalDep, notifier: NotifierDep
) -> WebhookEndpoint:
    return notifier.endpoints.update(principal.tenant, endpoint_id, body)


@router.delete("/webhook_endpoints/{endpoint_id}", response_model=DeletedWebhookEndpoint)
def delete_endpoint(endpoint_id: str, principal: PrincipalDep, notifier: NotifierDep) -> DeletedWebhookEndpoint:
    return notifier.endpoints.delete(principal.tenant, endpoint_id)


@router.post("/webhook_endpoints/{endpoint_id}/rotate_secret", response_model=WebhookEndpointWithSecret)
def rotate_secret(
    endpoint_id: str, principal: PrincipalDep, notifier: NotifierDep, body: RotateSecretRequest | None = None
) -> WebhookEndpointWithSecret:
    keep = body.keep_old_secret_active_for_24_hours if body else False
    return notifier.endpoints.rotate_secret(principal.tenant, endpoint_id, keep_old=keep)


@router.post("/webhook_endpoints/{endpoint_id}/test", response_model=WebhookEndpointTestResult, status_code=202)
def test_endpoint(
    endpoint_id: str, body: TestWebhookRequest, principal: PrincipalDep, notifier: NotifierDep
) -> WebhookEndpointTestResult:
    """Queues the sample event and answers at once; its outcome is in the endpoint's deliveries."""
    return notifier.test_endpoint(principal.tenant, endpoint_id, body.event_type)


@router.get("/webhook_event_types", response_model=WebhookEventTypeList)
def list_event_types(principal: PrincipalDep) -> WebhookEventTypeList:
    return WebhookEventTypeList(data=list(BATCH_EVENT_TYPES))


@router.get("/nightbatch/webhook_endpoints/{endpoint_id}/deliveries", response_model=ListPage[WebhookDelivery])
def list_deliveries(
    endpoint_id: str, principal: PrincipalDep, notifier: NotifierDep,
    limit: Annotated[int, Query()] = 20, after: str | None = None,
) -> ListPage[WebhookDelivery]:
    """Every delivery of the endpoint, newest first, each with all of its attempts (our extension)."""
    notifier.endpoints.item(principal.tenant, endpoint_id)
    return notifier.deliveries.list(principal.tenant, endpoint_id, limit=limit, after=after)
