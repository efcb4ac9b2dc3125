"""Secrets Manager adapter: the deployed stack's bootstrap API keys live in one secret."""

from __future__ import annotations

from typing import Any


def read_secret_string(client: Any, secret_id: str) -> str:
    return str(client.get_secret_value(SecretId=secret_id).get("SecretString") or "")
