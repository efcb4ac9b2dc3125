"""One place that renders every failure: OpenAI's `{"error": {...}}` envelope (nightbatch.errors.openai_error), or
Anthropic's `{"type": "error", "error": {...}, "request_id": ...}` (nightbatch.messages.errors.error_body) on the
Anthropic wire's paths (/v1/messages/…). The exception handlers, the middlewares' own answers and an idempotent
replay of a stored failure (idempotency.py) all render through `envelope`, so each wire gets its own shape
whichever of them answers."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from nightbatch.errors import NightbatchError, openai_error
from nightbatch.messages.errors import error_body

log = logging.getLogger("nightbatch.api")
MESSAGES_PATH = "/v1/messages"


def on_messages_wire(path: str) -> bool:
    return path == MESSAGES_PATH or path.startswith(MESSAGES_PATH + "/")


def envelope(path: str, status: int, message: str, *, type_: str = "invalid_request_error",
             param: str | None = None, code: str | None = None, request_id: str | None = None) -> dict[str, Any]:
    """The error body for a request to `path` (the middlewares' answers use it too)."""
    if on_messages_wire(path):
        return {**error_body(status, message), "request_id": request_id}
    return openai_error(message, type_=type_, param=param, code=code)


def error_response(request: Request, status: int, message: str, *, type_: str = "invalid_request_error",
                   param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    request_id = getattr(request.state, "request_id", None)
    return JSONResponse(envelope(request.url.path, status, message, type_=type_, param=param, code=code,
                                 request_id=request_id), status_code=status, headers=headers)


def exception_response(request: Request, exc: NightbatchError) -> JSONResponse:
    return error_response(request, exc.status, exc.message, type_=exc.type, param=exc.param, code=exc.code,
                          headers=exc.headers)


def stored_error_response(request: Request, status: int, stored: Any, headers: dict[str, str]) -> JSONResponse:
    """A failure kept for an idempotent replay, rendered for the wire it is replayed on. It is kept as its fields
    (`{"error": {"message", "type", "param", "code"}}`: NightbatchError.envelope), whatever the wire."""
    error = stored.get("error") if isinstance(stored, dict) else None
    if not isinstance(error, dict):
        return JSONResponse(stored, status_code=status, headers=headers)
    return error_response(request, status, str(error.get("message") or ""),
                          type_=str(error.get("type") or "invalid_request_error"), param=error.get("param"),
                          code=error.get("code"), headers=headers)


def _loc_param(loc: tuple[Any, ...]) -> str | None:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header", "form")]
    return ".".join(parts) or None


def validation_message(exc: RequestValidationError) -> tuple[str, str | None, str]:
    errs = exc.errors()
    if not errs:
        return "The request is invalid.", None, "invalid_request"
    e = errs[0]
    etype = str(e.get("type", ""))
    param = _loc_param(tuple(e.get("loc", ())))
    if etype == "json_invalid":
        return ("We could not parse the JSON body of your request. (HINT: This likely means you aren't using "
                "your HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was not "
                "valid JSON.)", None, "invalid_json")
    if etype == "missing" and param is None:
        return "A JSON request body is required.", None, "missing_required_parameter"
    if etype == "missing":
        return f"Missing required parameter: '{param}'.", param, "missing_required_parameter"
    if etype in ("model_attributes_type", "dict_type") and param is None:
        return "The request body must be a JSON object.", None, "invalid_type"
    msg = str(e.get("msg", "invalid value"))
    return f"Invalid value for '{param}': {msg}.", param, "invalid_type" if "type" in etype else "invalid_value"


def anthropic_validation_message(exc: RequestValidationError) -> str:
    """Anthropic's wording: `requests.0.params: Field required`."""
    errs = exc.errors()
    if not errs:
        return "The request is invalid."
    e = errs[0]
    if e.get("type") == "json_invalid":
        return "There was an error parsing the body of your request: it is not valid JSON."
    where = ".".join(str(p) for p in e.get("loc", ()) if p not in ("body", "query", "path", "header"))
    return f"{where or 'body'}: {e.get('msg', 'invalid value')}"


def install(app: FastAPI) -> None:
    @app.exception_handler(NightbatchError)
    async def _nightbatch(request: Request, exc: NightbatchError) -> JSONResponse:
        return exception_response(request, exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        if on_messages_wire(request.url.path):
            return error_response(request, 400, anthropic_validation_message(exc))
        message, param, code = validation_message(exc)
        return error_response(request, 400, message, param=param, code=code)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            message = f"Invalid URL ({request.method} {request.url.path})"
        elif exc.status_code == 405:
            message = f"Method {request.method} is not allowed for {request.url.path}."
        else:
            message = str(exc.detail)
        return error_response(request, exc.status_code, message, headers=getattr(exc, "headers", None))
