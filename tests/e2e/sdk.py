"""What every e2e test does through the OpenAI SDK: upload lines and create a batch, then poll it to an end."""

from __future__ import annotations

import io
import json
import time
from typing import Any

from openai import OpenAI
from openai.types import Batch

TERMINAL = {"completed", "failed", "expired", "cancelled"}


def submit(client: OpenAI, lines: list[dict[str, Any]], endpoint: str, window: str = "24h") -> Batch:
    data = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
    f = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    return client.batches.create(input_file_id=f.id, endpoint=endpoint, completion_window=window)  # type: ignore[arg-type]


def wait(client: OpenAI, batch_id: str, *, until: set[str] = TERMINAL, timeout: float = 600) -> Batch:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        b = client.batches.retrieve(batch_id)
        if b.status in until:
            return b
        time.sleep(1)
    raise AssertionError(f"batch {batch_id} still {b.status} after {timeout} s")
