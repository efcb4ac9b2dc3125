"""Lambda and worker environments built from setting names (`nightbatch.settings.SETTINGS`), so they cannot drift."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nightbatch.settings import SETTINGS


def env_name(setting: str) -> str:
    return SETTINGS[setting].env  # KeyError naming the setting when there is none


def _render(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def settings_environment(settings: Mapping[str, Any]) -> dict[str, str]:
    """{"bucket": ref} -> {"NIGHTBATCH_BUCKET": ref}; unknown setting names fail at synth."""
    return {env_name(setting): _render(value) for setting, value in settings.items()}
