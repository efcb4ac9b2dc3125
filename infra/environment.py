"""Lambda and worker environments built from `nightbatch.settings.Settings` field names, so they cannot drift."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nightbatch.settings import Settings

ENV_PREFIX = str(Settings.model_config.get("env_prefix", ""))


def env_name(field: str) -> str:
    if field not in Settings.model_fields:
        raise KeyError(f"{field!r} is not a field of nightbatch.settings.Settings")
    return f"{ENV_PREFIX}{field}".upper()


def _render(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def settings_environment(fields: Mapping[str, Any]) -> dict[str, str]:
    """{"bucket": ref} -> {"NIGHTBATCH_BUCKET": ref}; unknown field names fail at synth."""
    return {env_name(field): _render(value) for field, value in fields.items()}
