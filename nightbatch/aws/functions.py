"""Lambda adapter: starts another function of the stack asynchronously (the sweeper re-driving Notify)."""

from __future__ import annotations

import json
from typing import Any


class AsyncInvoker:
    def __init__(self, *, client: Any, function_name: str) -> None:
        self.client = client
        self.function_name = function_name

    def invoke(self, payload: dict[str, Any]) -> None:
        self.client.invoke(FunctionName=self.function_name, InvocationType="Event",
                           Payload=json.dumps(payload).encode())
