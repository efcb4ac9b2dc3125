"""TEST DOUBLE: a real HTTP server on loopback whose answers a unit test scripts, for the endpoint engine's own logic
(retries, headers, admission). It speaks HTTP/1.1 through the standard library's server; it is no model: the e2e
tests use a real `vllm serve` (tests/e2e/test_endpoint_backend.py).

`answer(request) -> Answer` decides each answer; every request is recorded (path, headers, JSON body).
An Answer with `drop=True` closes the connection without a response (a server going away mid-request);
`delay` holds the answer that long (a slow server).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any] | None


@dataclass(frozen=True)
class Answer:
    status: int = 200
    body: Any = None  # JSON-encoded unless bytes
    headers: dict[str, str] = field(default_factory=dict)
    drop: bool = False
    delay: float = 0.0


def chat_completion(body: dict[str, Any], *, content: str = "ok") -> dict[str, Any]:
    return {"id": "chatcmpl-test", "object": "chat.completion", "created": 1, "model": body.get("model"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}


@dataclass
class ScriptedServer:
    url: str  # http://127.0.0.1:<port>
    seen: list[Seen]
    answer: Callable[[Seen], Answer]

    @property
    def v1(self) -> str:
        return self.url + "/v1"


@contextlib.contextmanager
def scripted_server(answer: Callable[[Seen], Answer], *, port: int = 0) -> Iterator[ScriptedServer]:
    seen: list[Seen] = []
    lock = threading.Lock()
    holder: dict[str, ScriptedServer] = {}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _serve(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            request = Seen(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            with lock:
                seen.append(request)
            reply = holder["server"].answer(request)
            if reply.delay:
                time.sleep(reply.delay)
            if reply.drop:
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self.connection.shutdown(2)
                return
            data = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
            self.send_response(reply.status)
            for name, value in {"content-type": "application/json", **reply.headers}.items():
                self.send_header(name, value)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            with contextlib.suppress(OSError):
                self.wfile.write(data)

        do_GET = do_POST = _serve

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="scripted-server", daemon=True)
    thread.start()
    holder["server"] = ScriptedServer(url=f"http://127.0.0.1:{server.server_address[1]}", seen=seen, answer=answer)
    try:
        yield holder["server"]
    finally:
        server.shutdown()
        server.server_close()
