"""The section the endpoint backend reads: how a runner feeds an online server (gpu_worker/admission.py)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from nightbatch.settings.base import Env, Section


class AdmissionSettings(Section):
    """How an endpoint runner feeds an online server (gpu_worker/admission.py; docs/MODELS.md).

    AIMD concurrency per endpoint, the saturation thresholds read from the server's /metrics, request timeouts and
    retry backoff.
    Concurrency starts at `initial`, rises by `increase` after each window of as many successes as the current
    limit (one round trip's worth, as TCP does) while the server is not saturated, and is multiplied by `decrease`
    on a 429, a 503, a 502/504, a timeout or a refused connection (once per round: the answers to requests sent
    before the last decrease do not decrease it again) and on each read of the metrics that finds the server
    saturated; never below `floor`, nor above `ceiling` (a model's `endpoint.max_concurrency` overrides it).
    """

    floor: Annotated[int, Env("endpoint_min_concurrency"), Field(ge=1)] = 2
    ceiling: Annotated[int, Env("endpoint_max_concurrency"), Field(ge=1)] = 64
    initial: Annotated[int, Env("endpoint_initial_concurrency"), Field(ge=1)] = 8
    decrease: Annotated[float, Env("endpoint_backoff_factor"), Field(gt=0)] = 0.5  # below 1 (AdmissionPolicy checks)
    increase: Annotated[float, Env("endpoint_additive_increase"), Field(gt=0)] = 1.0
    # Saturated: requests waiting in the server's queue (vLLM's vllm:num_requests_waiting, summed over its
    # engines) at or above `max_waiting`, or KV-cache usage (vllm:kv_cache_usage_perc, 0-1) at or above
    # `max_kv_cache`; read every `metrics_seconds` (0: never).
    max_waiting: Annotated[int, Env("endpoint_max_waiting"), Field(ge=1)] = 5
    max_kv_cache: Annotated[float, Env("endpoint_max_kv_cache"), Field(gt=0)] = 0.8  # above 1: never by KV cache
    metrics_seconds: Annotated[float, Env("endpoint_metrics_seconds"), Field(ge=0)] = 2.0
    # One request's whole exchange; a timeout is a retry, never the line's result.
    timeout_seconds: Annotated[float, Env("endpoint_timeout_seconds"), Field(gt=0)] = 600.0
    # A request that must be retried waits this long, doubled each time up to the cap (with jitter), or what the
    # server's Retry-After says (up to `retry_after_max_seconds`), which holds every request to the endpoint.
    retry_seconds: Annotated[float, Env("endpoint_retry_seconds"), Field(gt=0)] = 1.0
    retry_max_seconds: Annotated[float, Env("endpoint_retry_max_seconds"), Field(gt=0)] = 30.0
    retry_after_max_seconds: Annotated[float, Env("endpoint_retry_after_max_seconds"), Field(gt=0)] = 300.0
    # A 500 with an OpenAI error body goes again this many times before it is the line's result (a server stopping
    # answers every request in flight so; a request that fails the server each time must end some day).
    server_error_retries: Annotated[int, Env("endpoint_server_error_retries"), Field(ge=0)] = 3
