"""ASGI middleware: an `x-request-id` on every response, request-body limits enforced while reading, and the
OpenAPI schema hidden in AWS."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from functions.api.errors import envelope, on_messages_wire
from nightbatch.files.uploads import part_limit_message
from nightbatch.ids import new_request_id
from nightbatch.logs import bind, unbind

Scope = dict[str, Any]
Message = dict[str, Any]
ASGIApp = Callable[..., Any]

log = logging.getLogger("nightbatch.api")

JSON_BODY_LIMIT = 1024 * 1024
MULTIPART_SLACK = 64 * 1024


class RequestIdMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = new_request_id()
        scope.setdefault("state", {})["request_id"] = request_id
        log_token = bind(request_id=request_id)  # every log line of this request carries its id

        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", request_id.encode()))
                if on_messages_wire(scope.get("path", "")):
                    headers.append((b"request-id", request_id.encode()))  # the Anthropic SDK reads this one
                message["headers"] = headers
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            # No stack trace or internal name reaches the client; the log has it, keyed by request id.
            log.exception("unhandled error", extra={"request_id": request_id, "path": scope.get("path")})
            if started:
                raise
            body = json.dumps(envelope(
                scope.get("path", ""), 500, "The server had an error while processing your request. Sorry about that!",
                type_="server_error", request_id=request_id)).encode()
            await send_with_id({"type": "http.response.start", "status": 500, "headers": [
                (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
            await send_with_id({"type": "http.response.body", "body": body})
        finally:
            unbind(log_token)


class BodyLimitMiddleware:
    """413 for bodies over the limit, checked on Content-Length and again while the body streams in."""

    def __init__(
        self, app: ASGIApp, *, upload_limit: Callable[[], int], part_limit: Callable[[], int] | None = None
    ) -> None:
        self.app = app
        self.upload_limit = upload_limit
        self.part_limit = part_limit

    def _limit(self, scope: Scope) -> tuple[int, str]:
        path: str = scope.get("path", "")
        if self.part_limit is not None and path.rstrip("/").endswith("/parts"):
            limit = self.part_limit()
            return limit + MULTIPART_SLACK, part_limit_message(limit)
        if path.rstrip("/").endswith("/messages/batches"):
            # A Message Batch's inline requests are its input file: the upload limit (AWS: a Lambda's body).
            limit = self.upload_limit()
            return limit, (f"Request body is larger than the {_human(limit)} limit for POST /v1/messages/batches on "
                           "this deployment: split the requests into several batches.")
        if path.rstrip("/").endswith(("/files", "/parts")):
            limit = self.upload_limit()
            return limit + MULTIPART_SLACK, _upload_message(limit)
        return JSON_BODY_LIMIT, f"Request body is larger than the {JSON_BODY_LIMIT // 1024} KiB limit."

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") in ("GET", "HEAD", "DELETE", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        limit, message = self._limit(scope)
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > limit:
                    await _send_413(send, message, scope)
                    return
        received = 0
        exceeded = False
        started = False

        async def limited_receive() -> Message:
            nonlocal received, exceeded
            msg: Message = await receive()
            if msg["type"] == "http.request":
                received += len(msg.get("body", b""))
                if received > limit:
                    exceeded = True
                    return {"type": "http.disconnect"}
            return msg

        async def guarded_send(msg: Message) -> None:
            nonlocal started
            if exceeded:
                return
            if msg["type"] == "http.response.start":
                started = True
            await send(msg)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if not exceeded:
                raise
        if exceeded and not started:
            await _send_413(send, message, scope)


def _upload_message(limit: int) -> str:
    return (
        f"File is larger than the {_human(limit)} limit for POST /v1/files on this deployment. "
        "Upload larger files with the Uploads API (POST /v1/uploads; in the OpenAI SDK "
        "client.uploads.upload_file_chunked(..., part_size=4 * 1024 * 1024))."
    )


def _human(n: int) -> str:
    if n % (1024 * 1024) == 0:
        return f"{n // (1024 * 1024)} MiB"
    if n % 1_000_000 == 0:
        return f"{n // 1_000_000} MB"
    return f"{n} bytes"


async def _send_413(send: Any, message: str, scope: Scope) -> None:
    request_id = scope.get("state", {}).get("request_id")
    body = json.dumps(envelope(scope.get("path", ""), 413, message, code="payload_too_large",
                               request_id=request_id)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if request_id:
        headers.append((b"x-request-id", request_id.encode()))
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class SchemaGateMiddleware:
    """`/openapi.json` only in the local mode: a deployment does not publish a map of its routes. (/docs and
    /redoc are off everywhere: they load scripts from a CDN onto the dashboard's origin.)"""

    def __init__(self, app: ASGIApp, *, enabled: Callable[[], bool], path: str = "/openapi.json") -> None:
        self.app = app
        self.enabled = enabled
        self.path = path

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope.get("path") == self.path and not self.enabled():
            # The same answer as any unknown route (functions/api/errors.py).
            body = json.dumps(envelope(self.path, 404, f"Invalid URL ({scope.get('method')} {self.path})")).encode()
            await send({"type": "http.response.start", "status": 404, "headers": [
                (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)
