"""Wire models of webhook endpoints (OpenAI SDK 3.x `client.webhooks`), deliveries and the delivery message."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

# The batch events OpenAI sends (docs/ARCHITECTURE.md "The OpenAI wire contract", point 7); the only types
# nightbatch emits, so the only ones it accepts.
BATCH_EVENT_TYPES: tuple[str, ...] = ("batch.completed", "batch.failed", "batch.expired", "batch.cancelled")


class WebhookEndpoint(BaseModel):
    id: str
    object: Literal["webhook_endpoint"] = "webhook_endpoint"
    created_at: int
    event_types: list[str]
    name: str
    signing_secret_hint: str | None = None
    url: str
    updated_at: int | None = None


class WebhookEndpointWithSecret(WebhookEndpoint):
    """Returned only by create and rotate_secret: the one time the secret leaves the server."""

    signing_secret: str


class DeletedWebhookEndpoint(BaseModel):
    id: str
    object: Literal["webhook_endpoint.deleted"] = "webhook_endpoint.deleted"
    deleted: bool = True


class WebhookEndpointTestResult(BaseModel):
    """`webhooks.test`'s answer (HTTP 202): the SDK's shape, and the queued delivery (our extension).

    The sample event is sent by the delivery queue's consumer, after this answer: `status_code` is this
    answer's own 202 (accepted), and the receiver's status arrives in the delivery's attempts."""

    event_type: str
    object: Literal["webhook_endpoint.test"] = "webhook_endpoint.test"
    status_code: int = 202
    success: Literal[True] = True
    webhook_endpoint_id: str
    delivery_id: str
    status: Literal["pending"] = "pending"


class WebhookEventTypeList(BaseModel):
    object: Literal["list"] = "list"
    data: list[str]


class CreateWebhookEndpointRequest(BaseModel):
    """Loosely typed so that each problem is answered with a 400 naming its parameter."""

    event_types: list[Any]
    name: str
    url: str


class UpdateWebhookEndpointRequest(BaseModel):
    event_types: list[Any] | None = None
    name: str | None = None
    url: str | None = None


class RotateSecretRequest(BaseModel):
    keep_old_secret_active_for_24_hours: bool = False


class TestWebhookRequest(BaseModel):
    event_type: str


class DeliveryAttempt(BaseModel):
    attempt: int
    attempted_at: int
    status_code: int | None = None
    error: str | None = None
    duration_ms: int
    next_attempt_at: int | None = None


class WebhookDelivery(BaseModel):
    """One event sent to one endpoint; `id` is the `webhook-id` header of every attempt."""

    id: str
    object: Literal["nightbatch.webhook_delivery"] = "nightbatch.webhook_delivery"
    webhook_endpoint_id: str
    event_id: str
    event_type: str
    batch_id: str | None = None
    status: Literal["pending", "succeeded", "failed"]
    test: bool = False
    created_at: int
    next_attempt_at: int | None = None
    attempts: list[DeliveryAttempt] = Field(default_factory=list)


class DeliveryMessage(BaseModel):
    """What the delivery queue carries: which delivery, which attempt, and not before when (unix seconds)."""

    version: Literal[1] = 1
    delivery_id: str
    attempt: int
    not_before: float


class NotifyInput(BaseModel):
    """The Notify step's input (the state machine passes Finalize's output; extra keys are ignored)."""

    version: Literal[1] = 1
    batch_id: str
