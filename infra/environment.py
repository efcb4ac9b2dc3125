"""Lambda and worker environments built from setting names (`nightbatch.settings.SETTINGS`), so they cannot drift."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nightbatch.settings import SETTINGS
from nightbatch.settings.document import render_value


def env_name(setting: str) -> str:
    return SETTINGS[setting].env  # KeyError naming the setting when there is none


def settings_environment(settings: Mapping[str, Any]) -> dict[str, str]:
    """{"bucket": ref} -> {"NIGHTBATCH_BUCKET": ref}; unknown setting names fail at synth."""
    return {env_name(setting): render_value(value) for setting, value in settings.items()}
