"""A model's `endpoint`: an OpenAI-compatible server that already serves it (a vLLM, SGLang or TGI fleet, an
llm-d/GIE pool), which the endpoint backend feeds a batch's lines to instead of starting GPUs of its own.

What one entry of NIGHTBATCH_MODELS_JSON (cdk.json `models`) says under `endpoint` (docs/MODELS.md). How requests
are admitted to it (AIMD concurrency, saturation) is the worker's (gpu_worker/admission.py); the thresholds are
settings (nightbatch/settings/admission.py).
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# RFC 9110's token: what a header's name may hold.
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
# Headers the backend sets itself on every request (the auth header, the deadline, the priority, the body's framing).
RESERVED_HEADERS = frozenset({"authorization", "content-type", "content-length", "host", "x-slo-ttft-ms",
                              "x-vllm-priority", "x-request-id"})
# vLLM's scheduler runs a lower `priority` first; an online request that names none has 0. A batch line goes after any
# online request with this default (docs/MODELS.md: set it above whatever your online traffic uses).
BATCH_PRIORITY = 1_000_000


class EndpointSpec(BaseModel):
    """Where a model is already served, and how nightbatch's requests identify themselves to it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # The server's OpenAI base URL, ending in /v1: a line's `/v1/chat/completions` goes to `<url>/chat/completions`.
    url: str
    # The name the server knows the model by (vLLM's --served-model-name); unset: the model's own name.
    model: str | None = None
    # Where the API key comes from, sent as `Authorization: Bearer <key>`: an environment variable (locally), or a
    # Secrets Manager secret's name or ARN whose string is the key (in AWS; the runner's role may read only it).
    api_key_env: str | None = None
    api_key_secret: str | None = None
    # Sent on every request, e.g. {"x-gateway-inference-objective": "batch-sheddable"} for an llm-d/GIE pool.
    headers: dict[str, str] = Field(default_factory=dict)
    # vLLM's request priority (the body's `priority` and the X-Vllm-Priority header; served with
    # `--scheduling-policy priority`, a lower value runs first and preempts a higher one). null: send none, for a
    # server that refuses the field.
    priority: int | None = BATCH_PRIORITY
    # The server's Prometheus metrics (vLLM's requests waiting and KV-cache usage: the saturation signal). Unset:
    # the URL's /metrics beside /v1; "": read none (a pool whose gateway does not expose them).
    metrics_url: str | None = None
    # The most requests in flight to this endpoint from one runner (AIMD's ceiling); unset: the setting
    # `endpoint_max_concurrency`. Size it to the servers behind the URL (a pool of N replicas takes N times one's).
    max_concurrency: int | None = Field(None, ge=1, le=10_000)

    @field_validator("url")
    @classmethod
    def _base_url(cls, url: str) -> str:
        url = url.strip().rstrip("/")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"endpoint url {url!r} is not an http(s) URL")
        if not parts.path.endswith("/v1"):
            raise ValueError(f"endpoint url {url!r} must be the server's OpenAI base URL, ending in /v1")
        if parts.query or parts.fragment:
            raise ValueError(f"endpoint url {url!r} may not have a query or fragment")
        return url

    @field_validator("metrics_url")
    @classmethod
    def _metrics_url(cls, url: str | None) -> str | None:
        if url and urlsplit(url).scheme not in ("http", "https"):
            raise ValueError(f"endpoint metrics_url {url!r} is not an http(s) URL")
        return url

    @field_validator("headers")
    @classmethod
    def _headers(cls, headers: dict[str, str]) -> dict[str, str]:
        for name, value in headers.items():
            if not _HEADER_NAME.fullmatch(name):
                raise ValueError(f"endpoint header name {name!r} is not a valid HTTP header name")
            if name.lower() in RESERVED_HEADERS:
                raise ValueError(f"endpoint header {name!r} is set by nightbatch itself")
            if any(c in value for c in "\r\n\0"):
                raise ValueError(f"endpoint header {name!r} has a line break or NUL in its value")
        return headers

    @model_validator(mode="after")
    def _one_key_source(self) -> EndpointSpec:
        if self.api_key_env and self.api_key_secret:
            raise ValueError("endpoint: give the API key by api_key_env or api_key_secret, not both")
        return self

    @property
    def served_metrics_url(self) -> str:
        """Where the saturation signal is read; "" when nowhere."""
        if self.metrics_url is not None:
            return self.metrics_url
        return self.url.removesuffix("/v1") + "/metrics"

    def request_url(self, endpoint: str) -> str:
        """A line's endpoint (`/v1/chat/completions`) on this server."""
        return self.url + endpoint.removeprefix("/v1")
