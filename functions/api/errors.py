"""One place that renders every failure as OpenAI's `{"error": {...}}` envelope."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from nightbatch.errors import NightbatchError

log = logging.getLogger("nightbatch.api")


def error_response(status: int, message: str, *, type_: str = "invalid_request_error",
                   param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": type_, "param": param, "code": code}},
        status_code=status, headers=headers,
    )


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


def install(app: FastAPI) -> None:
    @app.exception_handler(NightbatchError)
    async def _nightbatch(_: Request, exc: NightbatchError) -> JSONResponse:
        return JSONResponse(exc.envelope(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param, code = validation_message(exc)
        return error_response(400, message, param=param, code=code)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            message = f"Invalid URL ({request.method} {request.url.path})"
        elif exc.status_code == 405:
            message = f"Method {request.method} is not allowed for {request.url.path}."
        else:
            message = str(exc.detail)
        return error_response(exc.status_code, message, headers=getattr(exc, "headers", None))
