"""Anthropic's error object, by HTTP status: the API's envelope on /v1/messages/… (functions/api/errors.py) and an
errored result line's `error` (results.py). Light on purpose: the API's cold import loads it (tests/api)."""

from __future__ import annotations

from typing import Any

# Anthropic's error `type` for each HTTP status it answers with (its API reference, "Errors").
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
               529: "overloaded_error"}


def error_type(status: int) -> str:
    if status in ERROR_TYPES:
        return ERROR_TYPES[status]
    return "api_error" if status >= 500 else "invalid_request_error"


def error_body(status: int, message: str) -> dict[str, Any]:
    """`{"type": "error", "error": {"type", "message"}}` (the API adds `request_id`)."""
    return {"type": "error", "error": {"type": error_type(status), "message": message}}
