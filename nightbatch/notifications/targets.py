"""Webhook targets: a URL is resolved once and every address checked; delivery connects to the checked address.

Checking a name and then letting the HTTP client resolve it again would let DNS answer differently the second
time (rebinding), so the transport is handed the address, never the name.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from nightbatch.errors import InvalidRequestError

MAX_URL_LENGTH = 2048
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[..., list[tuple[Any, ...]]]


class TargetRefusedError(InvalidRequestError):
    """The URL is malformed, or it resolves to an address webhooks must not reach (SSRF)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, param="url", code="invalid_url")


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str  # as written in the URL: the Host header and the TLS server name
    port: int
    path: str  # path and query
    ip: str  # the checked address the connection goes to


def check_url(url: str, *, allow_private: bool) -> tuple[str, str, int, str]:
    """Syntax only: (scheme, host, port, path). HTTPS is required where private targets are refused (AWS)."""
    if not isinstance(url, str) or not url or len(url) > MAX_URL_LENGTH:
        raise TargetRefusedError(f"Invalid 'url': expected an absolute HTTPS URL of at most {MAX_URL_LENGTH} "
                                 "characters.")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise TargetRefusedError(f"Invalid 'url': {e}.") from e
    schemes = ("https", "http") if allow_private else ("https",)
    if parts.scheme not in schemes:
        raise TargetRefusedError(f"Invalid 'url': '{url}'. Webhook URLs must use "
                                 + " or ".join(s.upper() for s in schemes) + ".")
    if not parts.hostname:
        raise TargetRefusedError(f"Invalid 'url': '{url}' has no host.")
    if parts.username is not None or parts.password is not None:
        raise TargetRefusedError("Invalid 'url': credentials in the URL are not supported.")
    if any(ch in url for ch in "\r\n\t "):
        raise TargetRefusedError("Invalid 'url': whitespace is not allowed.")
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return parts.scheme, parts.hostname, port or (443 if parts.scheme == "https" else 80), path


def refusal(ip: IPAddress, *, allow_private: bool) -> str | None:
    """Why a webhook must not connect to `ip`, or None when it may."""
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if embedded is not None:
            return refusal(embedded, allow_private=allow_private)
    if ip.is_link_local:
        return "a link-local address (such as the instance metadata service)"
    if ip.is_multicast:
        return "a multicast address"
    if ip.is_unspecified:
        return "an unspecified address"
    if ip.is_loopback:
        return None if allow_private else "a loopback address"
    if ip.is_reserved:
        return "a reserved address"
    if ip.is_private:
        return None if allow_private else "a private address"
    if not ip.is_global:
        return "a non-public address"
    return None


def resolve_target(url: str, *, allow_private: bool, resolver: Resolver | None = None) -> Target:
    scheme, host, port, path = check_url(url, allow_private=allow_private)
    resolve = resolver or socket.getaddrinfo
    try:
        infos = resolve(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as e:
        raise TargetRefusedError(f"Invalid 'url': the host '{host}' could not be resolved.") from e
    addresses: list[IPAddress] = []
    for info in infos:
        addr = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if addr not in addresses:
            addresses.append(addr)
    if not addresses:
        raise TargetRefusedError(f"Invalid 'url': the host '{host}' has no addresses.")
    for addr in addresses:
        # Any refused address refuses the URL: a name with one public and one private record is an attack.
        reason = refusal(addr, allow_private=allow_private)
        if reason is not None:
            raise TargetRefusedError(f"Invalid 'url': '{host}' resolves to {addr}, {reason}; webhook targets "
                                     "must be public addresses.")
    return Target(scheme=scheme, host=host, port=port, path=path, ip=str(addresses[0]))
