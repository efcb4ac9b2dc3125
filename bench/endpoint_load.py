"""The endpoint bench's measurements: the online traffic (a fixed rate of short chats, open loop: each request goes at
its time whether or not the earlier ones have answered) and the server's own token counters, from which the batch's
throughput is read (vLLM's generated tokens, less the online traffic's own)."""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass, field

import httpx

from bench.vllm_server import API_KEY, SERVED_NAME

GENERATED = "vllm:generation_tokens_total"


@dataclass
class Interactive:
    """What one window of online traffic saw."""

    latencies: list[float] = field(default_factory=list)  # seconds, answered requests only
    failed: int = 0
    output_tokens: int = 0

    def quantile(self, q: float) -> float:
        if len(self.latencies) < 2:
            return self.latencies[0] if self.latencies else float("nan")
        return statistics.quantiles(self.latencies, n=100, method="inclusive")[round(q * 100) - 1]


async def online_traffic(base_url: str, *, rate: float, seconds: float, max_tokens: int, tag: str) -> Interactive:
    """`rate` short chats a second for `seconds`, as an online client sends them (no priority: vLLM's default 0)."""
    seen = Interactive()
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=httpx.Limits(max_connections=None),
                                 headers={"authorization": f"Bearer {API_KEY}"}) as client:

        async def one(i: int) -> None:
            body = {"model": SERVED_NAME, "max_tokens": max_tokens, "temperature": 0,
                    "messages": [{"role": "user", "content": f"{tag} {i}: say hello in one short sentence."}]}
            started = time.monotonic()
            try:
                r = await client.post(f"{base_url}/v1/chat/completions", json=body)
            except httpx.HTTPError:
                seen.failed += 1
                return
            if r.status_code != 200:
                seen.failed += 1
                return
            seen.latencies.append(time.monotonic() - started)
            seen.output_tokens += int(r.json().get("usage", {}).get("completion_tokens") or 0)

        tasks: list[asyncio.Task[None]] = []
        start = time.monotonic()
        for i in range(max(1, round(rate * seconds))):
            await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.gather(*tasks)
    return seen


def generated_tokens(base_url: str) -> float:
    """The server's generated tokens so far (summed over its engines)."""
    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(GENERATED + "{") or line.startswith(GENERATED + " "):
            total += float(line.rsplit(" ", 1)[-1])
    return total


@dataclass
class Window:
    """One measured window: the online traffic (if any) and the batch's generated tokens a second."""

    interactive: Interactive | None
    batch_tokens_per_second: float
    seconds: float


def measure(base_url: str, *, seconds: float, rate: float, max_tokens: int, tag: str) -> Window:
    """A window of `seconds`: the online traffic at `rate` (0: none), and the server's other generated tokens."""
    before, started = generated_tokens(base_url), time.monotonic()
    if rate > 0:
        interactive: Interactive | None = asyncio.run(online_traffic(
            base_url, rate=rate, seconds=seconds, max_tokens=max_tokens, tag=tag))
    else:
        interactive = None
        time.sleep(seconds)
    elapsed = time.monotonic() - started
    others = generated_tokens(base_url) - before - (interactive.output_tokens if interactive else 0)
    return Window(interactive, max(0.0, others) / elapsed, elapsed)
