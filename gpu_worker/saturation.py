"""The saturation signal: an online server's load, read from its Prometheus metrics, as the admission needs it.

vLLM exposes, per engine (label `engine`), `vllm:num_requests_waiting` (requests queued for a slot) and
`vllm:kv_cache_usage_perc` (0-1; `vllm:gpu_cache_usage_perc` in releases before 0.10). The server is saturated when
the requests waiting, summed over its engines, reach `max_waiting`, or any engine's KV cache reaches `max_kv_cache`
(the llm-d gateway's utilization detector: queue depth 5, KV cache 0.8). A server without them (SGLang, TGI, a
gateway) gives no reading and the admission runs on its answers alone.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass

import httpx

from gpu_worker.admission import Admission
from nightbatch.settings import AdmissionSettings

log = logging.getLogger("gpu_worker.saturation")

WAITING = ("vllm:num_requests_waiting",)
KV_CACHE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")


@dataclass(frozen=True)
class ServerLoad:
    waiting: float | None = None  # requests queued, summed over the server's engines
    kv_cache: float | None = None  # the fullest engine's KV-cache usage, 0-1

    @property
    def known(self) -> bool:
        return self.waiting is not None or self.kv_cache is not None

    def saturated(self, settings: AdmissionSettings) -> bool:
        return ((self.waiting is not None and self.waiting >= settings.max_waiting)
                or (self.kv_cache is not None and self.kv_cache >= settings.max_kv_cache))


def parse_load(text: str) -> ServerLoad:
    """The load in a Prometheus text exposition; names absent stay None."""
    waiting: float | None = None
    kv_cache: float | None = None
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name not in WAITING and name not in KV_CACHE:
            continue
        rest = line.rsplit("}", 1)[1].split() if "}" in line else line.split()[1:]
        try:
            value = float(rest[0])
        except (ValueError, IndexError):
            continue
        if not math.isfinite(value):
            continue
        if name in WAITING:
            waiting = (waiting or 0.0) + value
        else:
            kv_cache = max(kv_cache or 0.0, value)
    return ServerLoad(waiting=waiting, kv_cache=kv_cache)


async def read_load(client: httpx.AsyncClient, url: str) -> ServerLoad:
    """One reading; an unreadable one (down, 404, not Prometheus) is an unknown load."""
    try:
        response = await client.get(url)
    except httpx.HTTPError:
        return ServerLoad()
    if response.status_code != 200:
        return ServerLoad()
    return parse_load(response.text)


async def watch_load(client: httpx.AsyncClient, url: str, admission: Admission, settings: AdmissionSettings) -> None:
    """Reports every reading of the server's load to its admission until cancelled. Stops early when the server has
    never given one in its first readings (no metrics there)."""
    seen, misses = False, 0
    while True:
        load = await read_load(client, url)
        if load.known:
            seen = True  # from now on a failed reading is a passing one, not a server without metrics
            admission.report_saturation(load.saturated(settings))
        elif not seen:
            misses += 1
            if misses >= 3:
                log.info("no load readings at %s: admission by the server's answers alone", url)
                return
        await asyncio.sleep(settings.metrics_seconds)
