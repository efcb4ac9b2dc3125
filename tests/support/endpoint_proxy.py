"""A small HTTP proxy in the test, in front of the real server: it forwards every request and records what passed
(each POST's prompt, its answer's status, the requests in flight when it arrived), and can answer a storm of 429s
(as a gateway shedding a sheddable band does) or 502 while the server is down.

Run in a thread of the test process (uvicorn); the endpoint backend talks to it as to any OpenAI base URL.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.support.threaded_uvicorn import serving

HOP_BY_HOP = {"host", "content-length", "connection", "transfer-encoding", "keep-alive"}


@dataclass(frozen=True)
class Passed:
    """One POST: its prompt (the first message's text), the status it got, and the POSTs in flight when it came."""

    prompt: str
    status: int
    in_flight: int
    arrived: float  # time.monotonic()


@dataclass
class EndpointProxy:
    upstream: str  # http://127.0.0.1:<port> of the real server
    url: str = ""  # this proxy's, once started
    passed: list[Passed] = field(default_factory=list)
    in_flight: int = 0
    # The storm: after `storm_after` POSTs forwarded, the next `storm` POSTs get 429 (each with Retry-After 0).
    storm_after: int | None = None
    storm: int = 0
    forwarded: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def v1(self) -> str:
        return self.url + "/v1"

    def count(self, status: int) -> int:
        with self.lock:
            return sum(p.status == status for p in self.passed)

    def snapshot(self) -> list[Passed]:
        with self.lock:
            return list(self.passed)

    def start_storm(self, *, after: int, count: int) -> None:
        with self.lock:
            self.storm_after, self.storm = self.forwarded + after, count

    async def handle(self, request: Request, client: httpx.AsyncClient) -> Response:
        body = await request.body()
        if request.method != "POST":
            return await self._forward(request, body, client)
        prompt = _prompt(body)
        arrived = time.monotonic()
        with self.lock:
            self.in_flight += 1
            arrived_with = self.in_flight
            storming = self.storm > 0 and self.storm_after is not None and self.forwarded >= self.storm_after
            if storming:
                self.storm -= 1
            else:
                self.forwarded += 1
        status = 0
        try:
            if storming:
                response: Response = JSONResponse({"error": {"message": "shed: the pool is saturated",
                                                             "type": "rate_limit_error"}}, status_code=429,
                                                  headers={"retry-after": "0"})
            else:
                response = await self._forward(request, body, client)
            status = response.status_code
            return response
        finally:
            with self.lock:
                self.in_flight -= 1
                self.passed.append(Passed(prompt, status, arrived_with, arrived))

    async def _forward(self, request: Request, body: bytes, client: httpx.AsyncClient) -> Response:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        try:
            upstream = await client.request(request.method, self.upstream + request.url.path, content=body,
                                            headers=headers)
        except httpx.TransportError as exc:
            return JSONResponse({"error": {"message": f"upstream unreachable: {type(exc).__name__}"}},
                                status_code=502)
        keep = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP | {"content-encoding"}}
        return Response(upstream.content, status_code=upstream.status_code, headers=keep)


def _prompt(body: bytes) -> str:
    try:
        parsed: Any = json.loads(body)
        return str(parsed["messages"][0]["content"])
    except (ValueError, KeyError, IndexError, TypeError):
        return ""


@contextmanager
def running_proxy(upstream: str) -> Iterator[EndpointProxy]:
    proxy = EndpointProxy(upstream=upstream)
    holder: dict[str, httpx.AsyncClient] = {}

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=httpx.Limits(max_connections=None)) as c:
            holder["client"] = c
            yield

    async def route(request: Request) -> Response:
        return await proxy.handle(request, holder["client"])

    app = Starlette(routes=[Route("/{path:path}", route, methods=["GET", "POST"])], lifespan=lifespan)
    with serving(app, name="endpoint-proxy", lifespan="on") as port:
        proxy.url = f"http://127.0.0.1:{port}"
        yield proxy
