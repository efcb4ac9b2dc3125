"""Secrets Manager adapter: reads a secret's string value (the deployment's bootstrap API keys)."""

from __future__ import annotations

from typing import Any


class SecretReader:
    def __init__(self, *, client: Any) -> None:
        self.client = client

    def read(self, secret_id: str) -> str:
        """The secret's current string value; raises the client's error when it cannot be read."""
        return str(self.client.get_secret_value(SecretId=secret_id).get("SecretString") or "")
