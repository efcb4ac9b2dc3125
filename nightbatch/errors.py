"""The exception tree every layer raises; the API renders each as OpenAI's `{"error": {...}}` envelope.

    NightbatchError (500, api_error)
    ├── InvalidRequestError (400, invalid_request_error)
    │   ├── NotFoundError (404)
    │   ├── ConflictError (409, never retried by the SDK)
    │   └── PayloadTooLargeError (413)
    ├── AuthenticationError (401, invalid_api_key)
    └── RateLimitError (429, rate_limit_exceeded)
"""

from __future__ import annotations

from typing import Any


class NightbatchError(Exception):
    status = 500
    type = "api_error"
    default_code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code if code is not None else self.default_code
        self.headers = headers or {}

    def envelope(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class InvalidRequestError(NightbatchError):
    status = 400
    type = "invalid_request_error"


class NotFoundError(InvalidRequestError):
    status = 404


class ConflictError(InvalidRequestError):
    """A deterministic conflict: the SDK would retry a 409, so it carries `x-should-retry: false`."""

    status = 409

    def __init__(self, message: str, *, retry: bool = False, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.headers.setdefault("x-should-retry", "true" if retry else "false")


class PayloadTooLargeError(InvalidRequestError):
    status = 413
    default_code = "payload_too_large"


class AuthenticationError(NightbatchError):
    status = 401
    type = "invalid_request_error"
    default_code = "invalid_api_key"


class RateLimitError(NightbatchError):
    status = 429
    type = "rate_limit_error"
    default_code = "rate_limit_exceeded"


class StorageConflictError(Exception):
    """A conditional write lost: the item was not in the expected state (raised by the table adapter)."""


class StorageItemTooLargeError(Exception):
    """DynamoDB refused a write because the item would exceed its 400 KB limit (raised by the table adapter)."""


class BatchItemTooLargeError(ConflictError):
    """A batch whose stored record outgrew DynamoDB's item limit: it has been failed, for good."""

    default_code = "batch_item_too_large"
