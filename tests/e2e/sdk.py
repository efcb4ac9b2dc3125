"""What every e2e test does through the OpenAI SDK: upload lines and create a batch, then poll it to an end."""

from __future__ import annotations

import io
import json
import time
from typing import Any

from openai import OpenAI
from openai.types import Batch

TERMINAL = {"completed", "failed", "expired", "cancelled"}


def submit(client: OpenAI, lines: list[dict[str, Any]], endpoint: str, window: str = "24h",
           options: dict[str, Any] | None = None) -> Batch:
    """`options`: the batch's `nightbatch` options (extra_body)."""
    data = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
    f = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    return client.batches.create(input_file_id=f.id, endpoint=endpoint, completion_window=window,  # type: ignore[arg-type]
                                 extra_body={"nightbatch": options} if options else None)


def wait(client: OpenAI, batch_id: str, *, until: set[str] = TERMINAL, timeout: float = 600) -> Batch:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        b = client.batches.retrieve(batch_id)
        if b.status in until:
            return b
        time.sleep(1)
    raise AssertionError(f"batch {batch_id} still {b.status} after {timeout} s")


def wait_for_a_result(client: OpenAI, batch_id: str, timeout: float = 300) -> None:
    """Until the workers' counters show a first finished request (or the time is up: the caller's checks say)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        b = client.batches.retrieve(batch_id)
        if b.request_counts and b.request_counts.completed >= 1:
            return
        time.sleep(0.3)
