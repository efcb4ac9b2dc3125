"""The exception tree every layer raises, and OpenAI's error envelope (`openai_error`): the API renders each
exception with it, and the worker writes an engine's failure for one request in it.

    NightbatchError (500, api_error)
    ├── InvalidRequestError (400, invalid_request_error)
    │   ├── NotFoundError (404)
    │   ├── ConflictError (409, never retried by the SDK)
    │   └── PayloadTooLargeError (413)
    ├── AuthenticationError (401, invalid_api_key)
    └── RateLimitError (429, rate_limit_exceeded)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def openai_error(message: str, *, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | int | None = None) -> dict[str, Any]:
    """`{"error": {"message", "type", "param", "code"}}`: every OpenAI error body we write (the API's answers, an
    idempotent replay, a result line's engine failure). Anthropic's: nightbatch/messages/errors.py."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


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
        return openai_error(self.message, type_=self.type, param=self.param, code=self.code)


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


def check_supported(value: object, supported: Iterable[str], *, param: str, label: str | None = None) -> None:
    """The one "unsupported value" answer: 400 invalid_value naming every supported value."""
    allowed = tuple(supported)
    if value in allowed:
        return
    head = f"Invalid value for '{label}': {value!r}." if label else f"Invalid value: '{value}'."
    raise InvalidRequestError(f"{head} Supported values are: " + ", ".join(f"'{v}'" for v in allowed) + ".",
                              param=param, code="invalid_value")


def check_range(value: int, low: int, high: int, *, param: str) -> None:
    if not low <= value <= high:
        raise InvalidRequestError(f"Invalid '{param}': {value}. Expected a value between {low} and {high}.",
                                  param=param, code="invalid_value")
