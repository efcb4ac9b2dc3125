"""One HTTP POST to a checked address: no re-resolution, no redirects, a bounded wait, a small read."""

from __future__ import annotations

import http.client
import socket
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass

from nightbatch.notifications.targets import Target

MAX_RESPONSE_BYTES = 4096


@dataclass(frozen=True)
class PostResult:
    status_code: int | None
    error: str | None
    duration_ms: int

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """Connects to the checked IP; the Host header still names the URL's host."""

    def __init__(self, target: Target, timeout: float) -> None:
        super().__init__(target.host, target.port, timeout=timeout)
        self.ip = target.ip

    def connect(self) -> None:
        self.sock = socket.create_connection((self.ip, self.port), self.timeout)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """Connects to the checked IP and verifies the certificate against the URL's host name (SNI)."""

    def __init__(self, target: Target, timeout: float, tls: ssl.SSLContext) -> None:
        self.tls = tls
        super().__init__(target.host, target.port, timeout=timeout, context=tls)
        self.ip = target.ip

    def connect(self) -> None:
        sock = socket.create_connection((self.ip, self.port), self.timeout)
        self.sock = self.tls.wrap_socket(sock, server_hostname=self.host)


def post(
    target: Target, *, body: bytes, headers: Mapping[str, str], timeout: float, tls: ssl.SSLContext | None = None
) -> PostResult:
    """Sends once. A redirect is a failure like any other non-2xx: following it would skip the address check.

    `tls` defaults to the system's trust store with hostname checking (tests hand in their own CA)."""
    started = time.monotonic()
    conn: http.client.HTTPConnection
    if target.scheme == "https":
        conn = _PinnedHTTPSConnection(target, timeout, tls or ssl.create_default_context())
    else:
        conn = _PinnedHTTPConnection(target, timeout)
    status: int | None = None
    error: str | None = None
    try:
        conn.request("POST", target.path, body=body, headers=dict(headers))
        resp = conn.getresponse()
        status = resp.status
        resp.read(MAX_RESPONSE_BYTES)
    except TimeoutError:
        error = f"timed out after {timeout:g} s"
    except ConnectionRefusedError:
        error = "connection refused"
    except ssl.SSLError as e:
        error = f"TLS error: {e.reason or e}"
    except (OSError, http.client.HTTPException) as e:
        error = f"{type(e).__name__}: {e}"[:300]
    finally:
        conn.close()
    return PostResult(status_code=status, error=error, duration_ms=int((time.monotonic() - started) * 1000))
