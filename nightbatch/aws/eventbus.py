"""EventBridge adapter: puts one event on a bus (the account's default bus unless configured) and says which."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any


class EventBusError(Exception):
    """PutEvents refused the entry (it answers 200 with a per-entry error code, e.g. throttling or no bus)."""


class EventBus:
    def __init__(self, *, client: Any, bus: str) -> None:
        self.client = client
        self.bus = bus  # a name ("default") or an ARN

    def put(self, *, source: str, detail_type: str, detail: dict[str, Any], at: int | None = None,
            resources: list[str] | None = None) -> str:
        """EventBridge's id of the event; EventBusError when the entry was not accepted."""
        entry: dict[str, Any] = {"Source": source, "DetailType": detail_type, "EventBusName": self.bus,
                                 "Detail": json.dumps(detail, separators=(",", ":")),
                                 "Resources": resources or []}
        if at is not None:
            entry["Time"] = datetime.fromtimestamp(at, tz=UTC)
        resp = self.client.put_events(Entries=[entry])
        (answer,) = resp.get("Entries") or [{}]
        if resp.get("FailedEntryCount") or not answer.get("EventId"):
            raise EventBusError(f"{answer.get('ErrorCode', 'not accepted')}: {answer.get('ErrorMessage', '')}")
        return str(answer["EventId"])
