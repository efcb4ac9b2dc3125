"""The batch dashboard: one static page at `/`, `/dashboard` and `/dashboard/batches/{id}` calling the /v1 API
with the key typed in.

The page is assembled from the files in static/ when first served: each `<!-- include x.js -->` (or `.css`)
becomes an inline script (or style) whose hash the policy lists. No build step, and nothing but those exact
scripts can run on the page."""

from __future__ import annotations

import base64
import hashlib
import re
from functools import lru_cache
from importlib.resources import files

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

router = APIRouter(include_in_schema=False)

_INLINE = re.compile(r"<(script|style)>(.*?)</\1>", re.DOTALL)
_INCLUDE = re.compile(r"<!-- include ([a-z0-9_-]+)\.(js|css) -->")


def _include(match: re.Match[str]) -> str:
    name, kind = match.group(1), match.group(2)
    body = (files("functions.api") / "static" / f"{name}.{kind}").read_text(encoding="utf-8")
    tag = "script" if kind == "js" else "style"
    if f"</{tag}" in body:
        raise ValueError(f"static/{name}.{kind} must not contain </{tag}")
    return f"<{tag}>\n{body}</{tag}>"


@lru_cache(maxsize=1)
def _page() -> tuple[str, str]:
    html = (files("functions.api") / "static" / "dashboard.html").read_text(encoding="utf-8")
    html = _INCLUDE.sub(_include, html)
    # The page holds an API key: allow exactly its own inline script and style (by hash) and nothing else.
    hashes: dict[str, list[str]] = {"script": [], "style": []}
    for tag, body in _INLINE.findall(html):
        digest = base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()
        hashes[tag].append(f"'sha256-{digest}'")
    csp = "; ".join([
        "default-src 'none'",
        "script-src " + " ".join(hashes["script"]),
        "style-src " + " ".join(hashes["style"]),
        "connect-src 'self'",
        "img-src 'self' data:",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ])
    return html, csp


@router.get("/", response_class=HTMLResponse)
@router.get("/dashboard", response_class=HTMLResponse)
@router.get("/dashboard/batches/{batch_id}", response_class=HTMLResponse)
def dashboard() -> HTMLResponse:
    html, csp = _page()
    return HTMLResponse(html, headers={
        "content-security-policy": csp,
        "referrer-policy": "no-referrer",
        "x-content-type-options": "nosniff",
        "cache-control": "no-cache",
    })
